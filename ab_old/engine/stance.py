"""`engine.set_stance(...)`: what compiled functions do when they are called, as
`torch.compiler.set_stance` says for torch.compile.

- "default": compile on a cache miss (a first call, or a guard that fails).
- "force_eager": every compiled function runs its original code; nothing compiles.
- "eager_on_recompile": cached graphs still run; a miss runs the frame eagerly instead of
  compiling it (its calls still go through the engine, so their cached graphs run too).
- "fail_on_recompile": a miss that would compile raises RecompileError naming the frame
  and the guard(s) that failed.
- "eager_then_compile": a frame's first miss runs eagerly (its input sizes are remembered),
  its next one compiles; a size that differed between the two is dynamic from the start.

Use it as a call (`engine.set_stance("force_eager")`), a `with` block, or a decorator; a
block or decorated function puts the previous stance back when it ends.
`skip_guard_eval_unsafe=True`: a frame with exactly one cached graph runs it without
checking its guards (unsafe: an input the graph was not compiled for gives wrong results or
an error); with several graphs every guard is still checked.

The state is this module's `STANCE`; `capture/runtime.py` reads it where a call is
dispatched. `torch.compiler.set_stance(...)` is followed too (see `install_torch_hook`).
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from typing import Optional

import observe

STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile", "eager_then_compile")


class RecompileError(RuntimeError):
    """A frame would (re)compile while the stance is "fail_on_recompile"."""


class _Stance:
    """The current stance, as the flags the call path reads (each one attribute read)."""

    def __init__(self) -> None:
        self.name = "default"
        self.skip_guard_eval_unsafe = False
        self.force_eager = False    # run the original function, never look at the cache
        self.on_miss = False        # a cache miss asks `miss()` before compiling
        self.skip_guards = False    # one cached entry: run it unchecked


STANCE = _Stance()
_first_calls: set = set()   # eager_then_compile: code objects whose eager first call has run
_warned: set = set()


def _set(name: str, skip_guard_eval_unsafe: bool) -> tuple:
    prev = (STANCE.name, STANCE.skip_guard_eval_unsafe)
    STANCE.name = name
    STANCE.skip_guard_eval_unsafe = bool(skip_guard_eval_unsafe)
    STANCE.force_eager = name == "force_eager"
    STANCE.on_miss = name in ("eager_on_recompile", "fail_on_recompile", "eager_then_compile")
    STANCE.skip_guards = bool(skip_guard_eval_unsafe)
    return prev


def current() -> str:
    return STANCE.name


def reset() -> None:
    """engine.reset(): eager_then_compile starts over (the stance itself stays, as in torch)."""
    _first_calls.clear()


def _check(stance: str) -> str:
    if stance == "aot_eager_then_compile":
        _warn_once("engine.set_stance: 'aot_eager_then_compile' runs as 'eager_then_compile' here (the first "
                   "call runs eagerly, not under aot_eager); later calls compile as usual.")
        return "eager_then_compile"
    if stance not in STANCES:
        raise ValueError(f"invalid stance {stance!r}; the stances are {', '.join(map(repr, STANCES))}")
    return stance


class set_stance:
    """Set the compiler's stance (see the module docstring): a call, a `with` block or a
    decorator."""

    def __init__(self, stance: str = "default", *, skip_guard_eval_unsafe: bool = False) -> None:
        self.stance = (_check(stance), bool(skip_guard_eval_unsafe))
        self.prev = _set(*self.stance)

    def __enter__(self):
        _set(*self.stance)
        return self

    def __exit__(self, *exc) -> None:
        _set(*self.prev)

    def __call__(self, fn):
        _set(*self.prev)   # as a decorator it applies only while `fn` runs
        stance = self.stance

        @functools.wraps(fn)
        def with_stance(*args, **kwargs):
            prev = _set(*stance)
            try:
                return fn(*args, **kwargs)
            finally:
                _set(*prev)

        return with_stance

    def __repr__(self) -> str:
        return f"engine.set_stance({self.stance[0]!r}, skip_guard_eval_unsafe={self.stance[1]})"


# ---------------------------------------------------------------------- a cache miss


def miss(fn, L: dict, G: dict, previous: list, options) -> bool:
    """A call missed every cache entry and the stance is not "default": True when the frame
    runs eagerly instead of compiling; raises RecompileError under "fail_on_recompile";
    False to compile as usual. `previous`: the frame's entries for these options."""
    code = fn.__code__
    name = STANCE.name
    if name == "eager_then_compile":
        if code in _first_calls:
            return False
        _first_calls.add(code)
        if options.dynamic is None:
            _remember_sizes(code, L)
        observe.log("dynamo", logging.DEBUG, "%s (%s:%s): first call under stance 'eager_then_compile' runs "
                    "eagerly; the next one compiles", code.co_name, code.co_filename, code.co_firstlineno)
        return True
    if name == "eager_on_recompile":
        if previous:
            _log_reasons(code, previous, L, G, "stance 'eager_on_recompile': it runs eagerly instead")
        else:
            observe.log("dynamo", logging.DEBUG, "%s (%s:%s) not compiled: stance 'eager_on_recompile' runs it "
                        "eagerly", code.co_name, code.co_filename, code.co_firstlineno)
        return True
    if name == "fail_on_recompile":
        where = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"
        if previous:
            _log_reasons(code, previous, L, G, "stance 'fail_on_recompile': RecompileError raised")
            msg = (f"{where} would recompile, and the stance is 'fail_on_recompile'.\n"
                   + _reasons_text(previous, L, G))
        else:
            msg = (f"{where} would compile for the first time (it has no compiled entry for these compile "
                   f"options), and the stance is 'fail_on_recompile'.")
        raise RecompileError(msg + "\nengine.set_stance('default') lets it compile; docs/guards.md explains "
                                   "what makes a frame recompile.")
    return False


def _reasons_text(previous: list, L: dict, G: dict) -> str:
    lines = ["    triggered by the following guard failure(s):"]
    for e in reversed(previous):
        fails = e.guards.failures(L, G)
        lines.append(f"    - {e.compile_id}: {fails[0] if fails else '(guards pass now)'}")
    return "\n".join(lines)


def _log_reasons(code, previous: list, L: dict, G: dict, what: str) -> None:
    """The recompiles log shows a miss the stance kept from recompiling, with its reasons."""
    if observe.enabled("artifact", "recompiles"):
        def payload():
            return (f"Recompile needed for function {code.co_name} in {code.co_filename}:{code.co_firstlineno}; "
                    f"{what}\n"
                    + _reasons_text(previous, L, G))
        observe.emit("artifact", {"name": "recompile_reasons", "encoding": "string"}, payload, log="recompiles")


def _remember_sizes(code, L: dict) -> None:
    """eager_then_compile: the eager call's input sizes count as a compile's for automatic
    dynamic shapes, so the compile on the next call makes dynamic what changed in between."""
    import torch

    from .shapes import policy

    n = code.co_argcount + code.co_kwonlyargcount
    for arg in code.co_varnames[:n]:
        value = L.get(arg)
        source = f"L[{arg!r}]"
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            policy.automatic_dynamic_dims(code, source, tuple(value.size()))
        elif type(value) is int:
            policy.automatic_dynamic_dims(code, source, (value,))


# ---------------------------------------------------------------------- torch.compiler.set_stance


def install_torch_hook() -> None:
    """`torch.compiler.set_stance(...)` also sets the engine's stance. torch's own stance is
    set as well when torch._dynamo is already loaded (by the user's program, or by torch's
    ShapeEnv once anything compiled), so torch.compile in the same program follows too;
    the engine never loads it for this. `torch._dynamo.set_stance` called directly is not
    seen."""
    import torch.compiler as tc

    original = getattr(tc, "set_stance", None)
    if original is None or getattr(original, "_engine_original", None) is not None:
        return

    class torch_set_stance(set_stance):
        def __init__(self, stance: str = "default", *, skip_guard_eval_unsafe: bool = False,
                     force_backend=None) -> None:
            self._torch = None
            _check(stance)                       # ours first: an invalid stance changes neither
            if "torch._dynamo" in sys.modules:   # loaded by the user's program: torch.compile follows too
                self._torch = original(stance, skip_guard_eval_unsafe=skip_guard_eval_unsafe,
                                       force_backend=force_backend)
            elif force_backend is not None and stance != "default":
                raise RuntimeError("non-default stance cannot have force_backend set")
            if force_backend is not None:
                _warn_once("torch.compiler.set_stance(force_backend=...) is not followed by the engine: pass "
                           "backend= to engine.compile instead.")
            super().__init__(stance, skip_guard_eval_unsafe=skip_guard_eval_unsafe)

        def __enter__(self):
            if self._torch is not None:
                self._torch.__enter__()
            return super().__enter__()

        def __exit__(self, *exc) -> None:
            if self._torch is not None:
                self._torch.__exit__(*exc)
            super().__exit__(*exc)

        def __call__(self, fn):
            if self._torch is not None:
                fn = self._torch(fn)
            return super().__call__(fn)

    functools.update_wrapper(torch_set_stance, original, updated=())
    torch_set_stance._engine_original = original
    tc.set_stance = torch_set_stance


def _warn_once(msg: str) -> None:
    if msg in _warned:
        return
    _warned.add(msg)
    observe.log("dynamo", logging.WARNING, "%s", msg)
    from .capture.convert_frame import _user_stacklevel
    warnings.warn(msg, UserWarning, stacklevel=_user_stacklevel())
