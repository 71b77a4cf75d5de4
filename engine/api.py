"""The user-facing entry points: compile, explain, reset, disable, allow_in_graph,
disallow_in_graph, graph_break, mark_dynamic, mark_static."""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import types
import warnings
from typing import Optional

import torch

import observe

from .backends import lookup_backend
from .capture.runtime import OptimizedModule
from .markers import ALLOWED, DISALLOWED, graph_break  # noqa: F401  (graph_break: engine.graph_break)

_option_keys = itertools.count(1)


def _resolve_backend(backend):
    if isinstance(backend, str):
        return lookup_backend(backend), backend
    if callable(backend):
        return backend, getattr(backend, "__name__", type(backend).__name__)
    raise TypeError(f"backend must be a name or a callable backend(gm, example_inputs), got {type(backend).__name__}")


_warned: set = set()


def _options(backend, fullgraph, dynamic, mode, options):
    from .capture.runtime import CompileOptions

    if backend == "inductor" and (mode is not None or options):
        fn, name = _resolve_backend(backend)
        fn = _with_inductor_options(fn, mode, options)
    else:
        fn, name = _resolve_backend(backend)
    return CompileOptions(backend=fn, backend_name=name, fullgraph=fullgraph, dynamic=dynamic, key=next(_option_keys))


def _with_inductor_options(fn, mode, options):
    takes = inspect.signature(fn).parameters
    if "mode" not in takes and "options" not in takes:
        return fn

    def backend(gm, example_inputs):
        return fn(gm, example_inputs, mode=mode, options=options)
    backend.__name__ = getattr(fn, "__name__", "inductor")
    return backend


def _wrap_function(fn, opts):
    from .capture.runtime import run_function, trampoline_for

    if isinstance(fn, types.MethodType):
        func = fn.__func__
        if not isinstance(func, types.FunctionType):
            return fn
        call = trampoline_for(opts)      # a method as a call in compiled code makes it: opt.step too
        checked = []

        @functools.wraps(func)
        def bound(*args, **kwargs):
            if not checked:
                checked.append(_say_if_declined(fn, args, kwargs))
            return call(fn, *args, **kwargs)

        bound._engine_orig = fn
        return bound
    if not isinstance(fn, types.FunctionType):
        call = getattr(type(fn), "__call__", None)
        if isinstance(call, types.FunctionType):
            @functools.wraps(call)
            def call_obj(*args, **kwargs):
                return run_function(call, (fn,) + args, kwargs, opts)
            return call_obj
        raise TypeError(f"engine.compile expects a function, method or nn.Module, got {type(fn).__name__}")

    checked = []

    @functools.wraps(fn)
    def compiled(*args, **kwargs):
        if not checked:
            checked.append(_say_if_declined(fn, args, kwargs))
        return run_function(fn, args, kwargs, opts)

    compiled._engine_orig = fn
    compiled._engine_opts = opts
    return compiled


def _say_if_declined(fn, args, kwargs) -> bool:
    """A function handed to engine.compile that the engine will not capture (torch's own
    code, a generator, ...) runs eagerly: say so once, as a warning and a `compile_declined`
    event (explain and the report list it), never silently. Returns whether it was declined."""
    from .capture import runtime, skipfiles

    func = fn.__func__ if isinstance(fn, types.MethodType) else fn
    if isinstance(fn, types.MethodType) and runtime.optimizer_step_target(fn, args, kwargs) is not None:
        return False     # opt.step: its inner step compiles (runtime.optimizer_step)
    if runtime.should_compile(func):
        return False
    code = func.__code__
    reason = skipfiles.skip_reason(code) or runtime.uncapturable_kind(code) or "marked engine.disable"
    from .capture.convert_frame import _user_stacklevel, emit_declined
    name = emit_declined(code, reason)
    msg = (f"engine.compile({name}): not compiled, it runs eagerly ({reason}, {code.co_filename}:"
           f"{code.co_firstlineno}); compile the user function that calls it instead")
    observe.log("dynamo", logging.WARNING, "%s", msg)
    warnings.warn(msg, UserWarning, stacklevel=_user_stacklevel())
    return True


def compile(fn=None, *, backend="inductor", fullgraph: bool = False, dynamic: Optional[bool] = None,
            mode: Optional[str] = None, options: Optional[dict] = None, disable: bool = False):
    """Like torch.compile: `engine.compile(fn)`, `@engine.compile(backend="eager")`,
    `engine.compile(module)` -> OptimizedModule."""
    if fn is None:
        return lambda f: compile(f, backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode,
                                 options=options, disable=disable)
    if disable:
        return fn
    if not _python_supported():
        return fn
    opts = _options(backend, fullgraph, dynamic, mode, options)
    if isinstance(fn, torch.nn.Module):
        return OptimizedModule(fn, opts)
    return _wrap_function(fn, opts)


def _python_supported() -> bool:
    """On a CPython the capture has no table for (engine/capture/pyversion.py): raise
    UnsupportedPython naming it and the supported versions, or, with suppress_errors,
    say so once and let the function run eagerly."""
    from . import config
    from .capture import pyversion

    if pyversion.CURRENT is not None:
        return True
    msg = pyversion.unsupported_message()
    if not config.suppress_errors:
        raise pyversion.UnsupportedPython(msg)
    if "unsupported_python" not in _warned:
        _warned.add("unsupported_python")
        observe.log("dynamo", logging.WARNING, "%s; suppress_errors=True: running eagerly", msg)
        warnings.warn(f"{msg} suppress_errors=True: compiled functions run eagerly", RuntimeWarning, stacklevel=3)
    return False


def reset() -> None:
    """Forget every compiled frame, cache entry and counter."""
    from .capture import convert_frame, interpreter, resume, runtime

    runtime.reset()
    convert_frame._compiled_fn_counter[0] = 0
    interpreter._code_cache.clear()
    resume.clear_cache()
    from . import shapes
    shapes.reset()  # automatic-dynamic memory of each frame's input sizes
    from observe import metrics
    metrics.reset()  # compile_times() starts over with the caches
    from . import stance
    stance.reset()  # eager_then_compile: every frame's next call is a first call again


def disable(fn=None, recursive: bool = True):
    """Run `fn` eagerly, never compiled; calling it from compiled code breaks the graph.
    With recursive=True (the default) nothing it calls is compiled either."""
    if fn is None:
        return lambda f: disable(f, recursive=recursive)
    from .capture.runtime import disabled_region

    if isinstance(fn, torch.nn.Module):
        fn.forward = disable(fn.forward, recursive=recursive)
        return fn
    orig = getattr(fn, "_engine_orig", fn)

    @functools.wraps(orig)
    def run_eagerly(*args, **kwargs):
        if recursive:
            with disabled_region():
                return orig(*args, **kwargs)
        return orig(*args, **kwargs)

    run_eagerly._engine_disabled = True
    if not recursive and isinstance(orig, types.FunctionType):
        run_eagerly._engine_routed = orig  # called from compiled code: a routed copy, its callees compile
    DISALLOWED.add(run_eagerly)
    return run_eagerly


def allow_in_graph(fn):
    """Put calls to `fn` in the graph as one node (it must be traceable with FakeTensors)."""
    ALLOWED.add(fn)
    DISALLOWED.discard(fn)
    return fn


def disallow_in_graph(fn):
    """Calls to `fn` always break the graph and run eagerly."""
    DISALLOWED.add(fn)
    ALLOWED.discard(fn)
    return fn


def mark_dynamic(t: torch.Tensor, index, min=None, max=None) -> None:
    """Make dimension(s) `index` of `t` symbolic from the first compile on (engine/shapes),
    optionally within [min, max] (a call outside the range recompiles). Sizes 0 and 1
    still specialize."""
    indices = index if isinstance(index, (list, tuple)) else [index]
    dims = set(getattr(t, "_dynamo_dynamic_indices", set()))
    dims.update(indices)
    t._dynamo_dynamic_indices = dims
    if min is not None or max is not None:
        ranges = dict(getattr(t, "_engine_dynamic_ranges", {}))
        ranges.update({d: (min, max) for d in indices})
        t._engine_dynamic_ranges = ranges


def mark_static(t, index=None) -> None:
    """Record that `t` (or dimension `index`) is static."""
    if isinstance(t, torch.Tensor):
        dims = set(getattr(t, "_dynamo_static_indices", set()))
        if index is None:
            dims.update(range(t.dim()))
        else:
            dims.update(index if isinstance(index, (list, tuple)) else [index])
        t._dynamo_static_indices = dims


def explain(fn, *extra_args, **extra_kwargs):
    """`engine.explain(fn)(*args, **kwargs)` -> ExplainOutput (graphs, breaks with reasons
    and hints, guards, op counts)."""
    from .debug.explain import explain as _explain
    return _explain(fn, *extra_args, **extra_kwargs)
