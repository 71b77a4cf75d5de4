"""The per-code cache and the call path that replaces PEP 523: `run_function(fn, args,
kwargs, options)` binds the arguments, checks each cache entry's guards, runs the first
entry that passes, or converts the frame with the real argument values on a miss.

Calls made by code that is not captured (the instruction run eagerly at a graph break,
resume functions) come back here through `trampoline`, so those frames compile too."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import types
from typing import Any, Callable, Optional

import torch

import observe

from .. import config, stance, torch_config
from ..stance import STANCE  # engine.set_stance
from . import routed, skipfiles
from ..distributed import ddp
from torch.nn.parallel import DistributedDataParallel as _DDP


@dataclasses.dataclass
class CompileOptions:
    backend: Any             # the resolved backend callable
    backend_name: str
    fullgraph: bool = False
    dynamic: Optional[bool] = None
    key: int = 0             # cache entries are per options key (a different backend compiles again)


@dataclasses.dataclass
class CacheEntry:
    guards: Any              # CompiledGuards
    fn: Callable             # transformed(L, G, F)
    options_key: int
    compile_id: str
    code_text: str = ""


class FrameCache:
    def __init__(self, code):
        self.code = code
        self.entries: list[CacheEntry] = []     # in compile order (recompile reasons, explain, limits)
        # what a call tries, per options key: most recently hit (or added) first, as PyTorch's
        # cache moves a hit entry to the front; a newer entry is usually the more general one
        self.lookup: dict[int, list[CacheEntry]] = {}
        self.skip = False          # run eagerly forever (the frame cannot be captured)
        self.frame_id: Optional[int] = None
        self.compiles = 0
        self.binder = None
        self.limit_warned = False


_CACHES: dict = {}
_FRAME_IDS: dict = {}
_COMPILABLE: dict = {}   # code -> (should_compile's answer from the code alone, the same with force)


_FunctionType = types.FunctionType


class _State(threading.local):
    disabled = 0         # a class default: reading it needs no getattr fallback on the hit path


_state = _State()


def reset() -> None:
    _CACHES.clear()
    _FRAME_IDS.clear()
    _COMPILABLE.clear()
    _TRAMPOLINES.clear()
    routed.clear_cache()


def cache_for(code) -> FrameCache:
    c = _CACHES.get(code)
    if c is None:
        c = _CACHES[code] = FrameCache(code)
    return c


def frame_id_for(code) -> int:
    fid = _FRAME_IDS.get(code)
    if fid is None:
        fid = _FRAME_IDS[code] = len(_FRAME_IDS)
    return fid


# ---------------------------------------------------------------------- binding


def make_binder(code) -> Callable:
    """A function with the same parameters as `code` that returns its locals as a dict."""
    n = code.co_argcount
    names = list(code.co_varnames[:n + code.co_kwonlyargcount])
    params = []
    for i, name in enumerate(code.co_varnames[:n]):
        params.append(name)
        if code.co_posonlyargcount and i == code.co_posonlyargcount - 1:
            params.append("/")
    idx = n + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        params.append("*" + code.co_varnames[idx])
        names.append(code.co_varnames[idx])
        idx += 1
    elif code.co_kwonlyargcount:
        params.append("*")
    params.extend(code.co_varnames[n:n + code.co_kwonlyargcount])
    if code.co_flags & inspect.CO_VARKEYWORDS:
        params.append("**" + code.co_varnames[idx])
        names.append(code.co_varnames[idx])
    # named like the function, so a bad call reads like the eager error ("fn() missing 1 required ...")
    name = code.co_name if code.co_name.isidentifier() and not code.co_name.startswith("__") else "___bind"
    src = f"def {name}({', '.join(params)}):\n    return {{{', '.join(f'{x!r}: {x}' for x in names)}}}\n"
    ns: dict = {}
    exec(compile(src, "<engine binder>", "exec"), ns)
    return ns[name]


def bind_frame(cache: FrameCache, fn, args, kwargs) -> dict:
    binder = cache.binder
    if binder is None:
        binder = cache.binder = make_binder(fn.__code__)
    if binder.__defaults__ is not fn.__defaults__:
        binder.__defaults__ = fn.__defaults__
    if binder.__kwdefaults__ is not fn.__kwdefaults__:
        binder.__kwdefaults__ = fn.__kwdefaults__
    L = binder(*args, **kwargs)
    closure = fn.__closure__
    if closure:
        for name, cell in zip(fn.__code__.co_freevars, closure):
            try:
                L[name] = cell.cell_contents
            except ValueError:
                pass
    return L


# ---------------------------------------------------------------------- which frames compile


def should_compile(fn, force: bool = False) -> bool:
    """`force`: a frame inside torch that compiles anyway (an optimizer step, a resume function)."""
    if not isinstance(fn, types.FunctionType):
        return False
    if getattr(fn, "_engine_disabled", False):
        return False
    return _code_compilable(fn.__code__)[force]


def _code_compilable(code) -> tuple:
    """should_compile's answer from the code object alone, (without force, with force, and
    whether a frame that is not captured is still user code, run as a routed copy):
    computed once per code, as it costs more than the rest of a cache hit."""
    ok = _COMPILABLE.get(code)
    if ok is None:
        where, forced = skipfiles.skip_reason(code), skipfiles.skip_reason(code, force=True)
        kind = uncapturable_kind(code)
        if where is not None:
            skipfiles.log_skip(code, where)
        elif kind is not None:
            observe.log("dynamo", logging.DEBUG, "%s (%s:%s) is %s: not captured; it runs as a routed copy, so "
                        "what it calls compiles", code.co_name, code.co_filename, code.co_firstlineno, kind)
        ok = _COMPILABLE[code] = (where is None and kind is None, forced is None and kind is None,
                                  where is None and kind is not None)
    return ok


def uncapturable_kind(code) -> Optional[str]:
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS) + \
        bool(code.co_flags & inspect.CO_VARKEYWORDS)
    if not all(name.isidentifier() for name in code.co_varnames[:n]):
        return "a comprehension's frame"  # `.0`: not a frame a user calls
    if code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR |
                        inspect.CO_ITERABLE_COROUTINE):
        return "a generator or coroutine"
    return None


# ---------------------------------------------------------------------- running


def _disabled_depth() -> int:
    return _state.disabled


class disabled_region:
    """While running a function marked with engine.disable, nothing below compiles."""

    def __enter__(self):
        _state.disabled = _disabled_depth() + 1

    def __exit__(self, *exc):
        _state.disabled = _disabled_depth() - 1


def run_function(fn, args, kwargs, options: CompileOptions, force: bool = False, reported=None):
    """`force`: compile `fn` even though it lives in torch (an optimizer's step, see
    `optimizer_step`), as PEP 523 would see its frame."""
    # the hit path: every test below is a few attribute reads (should_compile is cached per code)
    if _state.disabled or STANCE.force_eager or type(fn) is not _FunctionType:
        return fn(*args, **kwargs)
    if getattr(fn, "_engine_disabled", False):
        inner = getattr(fn, "_engine_routed", None)  # engine.disable(f, recursive=False)
        return fn(*args, **kwargs) if inner is None else run_routed(inner, args, kwargs, options)
    code = fn.__code__
    ok = _COMPILABLE.get(code) or _code_compilable(code)
    if not ok[force]:
        if ok[2]:
            return run_routed(fn, args, kwargs, options, reported)
        return fn(*args, **kwargs)
    only = config.debug_function
    if only and code.co_name != only and not code.co_name.startswith(f"engine_resume_in_{only}_at_"):
        return fn(*args, **kwargs)  # TORCHDYNAMO_DEBUG_FUNCTION: compile only this function
    cache = _CACHES.get(code) or cache_for(code)
    if cache.skip:
        return run_routed(fn, args, kwargs, options, reported)
    L = bind_frame(cache, fn, args, kwargs)
    G = fn.__globals__
    entries = cache.lookup.get(options.key)
    if entries:
        entry = entries[0]
        if (STANCE.skip_guards and len(entries) == 1) or entry.guards.check(L, G):
            return entry.fn(L, G, fn)
        for i in range(1, len(entries)):
            entry = entries[i]
            if entry.guards.check(L, G):
                # most recently used first; a new list, so that a call iterating the old one
                # in another thread never sees it shrink
                cache.lookup[options.key] = [entry] + entries[:i] + entries[i + 1:]
                return entry.fn(L, G, fn)
    # miss: compile with the real values
    key = options.key
    mine = [e for e in cache.entries if e.options_key == key]
    if STANCE.on_miss and stance.miss(fn, L, G, mine, options):  # runs eagerly instead (or raises)
        return run_routed(fn, args, kwargs, options, reported)
    torch_config.sync()  # knobs the user set on torch._dynamo.config / torch._inductor.config
    if len(mine) >= config.cache_size_limit or len(cache.entries) >= config.accumulated_cache_size_limit:
        if not cache.limit_warned:
            cache.limit_warned = True
            from .convert_frame import report_cache_limit
            report_cache_limit(code, mine or cache.entries, L, G,
                               "cache_size_limit" if len(mine) >= config.cache_size_limit
                               else "accumulated_cache_size_limit")
        return run_routed(fn, args, kwargs, options, reported)
    from .convert_frame import convert_frame
    entry = convert_frame(fn, L, G, options, cache, mine, reported)
    if entry is None:
        cache.skip = True
        observe.log("dynamo", logging.DEBUG, "%s (%s:%s) is not captured: it runs as a routed copy, so what it "
                    "calls compiles", code.co_name, code.co_filename, code.co_firstlineno)
        return run_routed(fn, args, kwargs, options, reported)
    cache.entries.append(entry)
    cache.lookup[key] = [entry] + cache.lookup.get(key, [])
    return entry.fn(L, G, fn)


def run_routed(fn, args, kwargs, options: CompileOptions, reported=None):
    """No frame is lost: `fn` runs a copy of its code whose calls go through the engine."""
    return routed.routed_function(fn, trampoline_for(options, reported), (options.key, reported))(*args, **kwargs)


class GradModeExit:
    """The `__exit__` of a grad-mode `with` block (torch.no_grad(), enable_grad(),
    set_grad_enabled(m)) that a graph break split: passed to the resume function on the
    value stack where the block's own exit was, it restores the mode from before the
    block when the block ends, normally or by an exception (the resume function keeps
    the frame's exception table)."""

    __slots__ = ("prev",)

    def __init__(self, prev: bool):
        self.prev = prev

    def __call__(self, *exc_info):
        torch._C._set_grad_enabled(self.prev)
        return None

    def __repr__(self):
        return f"GradModeExit(prev={self.prev})"


class ProfilerRangeExit:
    """The `__exit__` of a `torch.profiler.record_function` block that a graph break split:
    the traced code never entered the range (the graph has no node for it), so leaving it
    does nothing; the eager code at the break and after it runs outside the range."""

    __slots__ = ()

    def __call__(self, *exc_info):
        return None

    def __repr__(self):
        return "ProfilerRangeExit()"


def exit_blocks(exits: tuple) -> None:
    """An exception from a break inside grad-mode / autocast with blocks leaves them all,
    innermost first (the generated code's `except` clause)."""
    for exit_ in reversed(exits):
        exit_(None, None, None)


_TRAMPOLINES: dict = {}


def trampoline_for(options: CompileOptions, reported=None) -> Callable:
    """One trampoline per compile options and reported break (routed copies are cached with it)."""
    t = _TRAMPOLINES.get((options.key, reported))
    if t is None:
        t = _TRAMPOLINES[(options.key, reported)] = make_trampoline(options, reported)
    return t


def make_trampoline(options: CompileOptions, reported=None) -> Callable:
    """What generated code calls at a graph break instead of calling `fn` directly.
    `reported`: the break's root (file, line, kind) when it happened inside the callee,
    which this frame has reported already: the callee, compiled as a frame of its own,
    breaks there again and does not report it twice."""

    def trampoline(fn, *args, **kwargs):
        if isinstance(fn, types.FunctionType):
            return run_function(fn, args, kwargs, options, reported=reported)
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            inner = optimizer_step_target(fn, args, kwargs)
            if inner is not None:
                return optimizer_step(fn.__self__, inner, options)
            return run_function(fn.__func__, (fn.__self__,) + args, kwargs, options, reported=reported)
        if isinstance(fn, torch.nn.Module):
            if isinstance(fn, _DDP):   # DDP's forward runs eagerly around the wrapped module's, compiled
                return ddp.call_ddp(fn, args, kwargs, options)
            if _plain_module_call(fn):
                return run_function(type(fn).forward, (fn,) + args, kwargs, options, reported=reported)
            call = type(fn).__call__
            if isinstance(call, types.FunctionType):
                # hooks or an instance-level forward: Module.__call__ itself is the frame (what
                # PEP 523 sees first), captured or run routed, so forward still compiles
                return run_function(call, (fn,) + args, kwargs, options, reported=reported)
        return fn(*args, **kwargs)

    return trampoline


# ---------------------------------------------------------------------- optimizer steps
#
# `opt.step()` is two torch wrappers around the optimizer's own `step`: a profiler range
# with the step hooks (Optimizer.profile_hook_step) and a grad-mode switch between two
# `torch._dynamo.graph_break()`s (_use_grad_for_differentiable). Under PEP 523 Dynamo
# runs the wrappers eagerly and compiles the inner `step` frame (its parameter loop and
# in-place updates under no_grad). Without PEP 523 the eager wrappers cannot route that
# call to us, so at a graph break on `opt.step()` the trampoline runs the wrappers' own
# steps itself (only when no step hooks are registered and no closure is passed, so they
# reduce to exactly this) and compiles the inner step.

_WRAPPER_CODES: list = []
OPTIM_DIR = skipfiles.OPTIM_DIR


def _wrapper_codes() -> tuple:
    """(profile_hook_step's wrapper, _use_grad_for_differentiable's _use_grad) code objects
    (functools.wraps gives the wrappers the inner step's names: only their code tells)."""
    if not _WRAPPER_CODES:
        from torch.optim import optimizer as optim_mod
        _WRAPPER_CODES.append(optim_mod.Optimizer.profile_hook_step(lambda self: None).__code__)
        _WRAPPER_CODES.append(optim_mod._use_grad_for_differentiable(lambda self: None).__code__)
    return tuple(_WRAPPER_CODES)


def is_optimizer_step_wrapper(fn) -> bool:
    return isinstance(fn, types.FunctionType) and fn.__code__ is _wrapper_codes()[0]


def optimizer_step_target(method, args, kwargs):
    """The inner step function of `opt.step` (a bound method) when calling it reduces to
    the profiler range, the grad-mode switch and that function; otherwise None."""
    opt = method.__self__
    if args or kwargs or not isinstance(opt, torch.optim.Optimizer):
        return None
    wrapper = method.__func__
    if not is_optimizer_step_wrapper(wrapper):
        return None
    use_grad = getattr(wrapper, "__wrapped__", None)
    if not isinstance(use_grad, types.FunctionType) or use_grad.__code__ is not _wrapper_codes()[1]:
        return None
    inner = getattr(use_grad, "__wrapped__", None)
    if not isinstance(inner, types.FunctionType) or not inner.__code__.co_filename.startswith(OPTIM_DIR):
        return None
    from torch.optim import optimizer as optim_mod
    if (optim_mod._global_optimizer_pre_hooks or optim_mod._global_optimizer_post_hooks or
            opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks):
        return None
    if not isinstance(opt.defaults, dict) or "differentiable" not in opt.defaults:
        return None
    return inner


def optimizer_step(opt, inner, options: CompileOptions):
    """What `opt.step()` does (profile_hook_step + _use_grad_for_differentiable), with the
    inner step compiled."""
    from .optimizers import capturable_in_trace, make_capturable
    make_capturable(opt)
    with torch.autograd.profiler.record_function(f"Optimizer.step#{opt.__class__.__name__}.step"):
        prev = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(opt.defaults["differentiable"])
            with capturable_in_trace(opt):
                out = run_function(inner, (opt,), {}, options, force=True)
        finally:
            torch.set_grad_enabled(prev)
        opt._optimizer_step_code()
        return out


def _plain_module_call(m) -> bool:
    from torch.nn.modules import module as module_mod
    return (type(m).__call__ is torch.nn.Module.__call__ and isinstance(type(m).forward, types.FunctionType)
            and "forward" not in m.__dict__
            and not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or
                     getattr(m, "_backward_pre_hooks", None) or module_mod._global_forward_hooks or
                     module_mod._global_forward_pre_hooks or module_mod._global_backward_hooks or
                     getattr(module_mod, "_global_backward_pre_hooks", None)))


def call_compiled_module(m, args, kwargs, options):
    """OptimizedModule.__call__: compile forward with `self` as L['self'] (hooks, if any,
    run eagerly around it)."""
    if isinstance(m, _DDP):
        return ddp.call_ddp(m, args, kwargs, options)
    if _plain_module_call(m):
        return run_function(type(m).forward, (m,) + tuple(args), kwargs, options)
    call = type(m).__call__
    if isinstance(call, types.FunctionType):
        # hooks (FSDP2's, say): Module.__call__ is the frame, as in the trampoline, so that
        # forward compiles while hooks the capture cannot trace run eagerly at graph breaks
        return run_function(call, (m,) + tuple(args), kwargs, options)
    return m(*args, **kwargs)


class OptimizedModule(torch.nn.Module):
    """`engine.compile(module)`: calls compile the module's forward with `self` as
    L['self']. The original module is `_orig_mod`; attribute access forwards to it."""

    _engine_opts = None

    def __init__(self, mod: torch.nn.Module, opts) -> None:
        super().__init__()
        self._orig_mod = mod
        object.__setattr__(self, "_engine_opts", opts)

    def __call__(self, *args, **kwargs):
        return call_compiled_module(self._orig_mod, args, kwargs, self._engine_opts)

    def forward(self, *args, **kwargs):
        return self.__call__(*args, **kwargs)

    def __getattr__(self, name):
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        return getattr(self._modules["_orig_mod"], name)

    def __repr__(self):
        return f"OptimizedModule({self._orig_mod!r})"
