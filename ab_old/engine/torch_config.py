"""`torch._dynamo.config.suppress_errors = True` (and the other knobs of PyTorch's guide)
in a program that runs the engine: honoured, without the engine importing those modules.

Before each compile, `sync()` looks in `sys.modules` for `torch._dynamo.config` and
`torch._inductor.config` (loaded by the user's program, or by torch itself: its ShapeEnv
imports torch._dynamo). The knobs the user changed from torch's default are copied onto the engine's own (`engine.config`), and put
back when the user changes them back (a `torch._dynamo.config.patch(...)` block ends).

Which one wins: a knob set on `engine.config` itself (to a value other than its default)
wins over the torch spelling; otherwise the torch knob the user set is used. A torch knob
the engine has no counterpart for, once the user changes it, is named in one warning
(on the bus and as a Python warning), once per knob. So are the guide's environment
variables the engine does not act on (`check_environment`, at import), with what to use
instead.
"""

from __future__ import annotations

import logging
import sys
import warnings

import observe

from . import config

# torch knob -> engine.config knob
DYNAMO = {
    "suppress_errors": "suppress_errors",
    "verbose": "verbose",
    "recompile_limit": "cache_size_limit",            # torch >= 2.7 spelling; cache_size_limit is its alias
    "cache_size_limit": "cache_size_limit",
    "accumulated_recompile_limit": "accumulated_cache_size_limit",
    "accumulated_cache_size_limit": "accumulated_cache_size_limit",
    "capture_scalar_outputs": "capture_scalar_outputs",
    "automatic_dynamic_shapes": "automatic_dynamic_shapes",
    "assume_static_by_default": "assume_static_by_default",
    "reorderable_logging_functions": "reorderable_logging_functions",
    "debug_dir_root": "debug_dir_root",
    "repro_after": "repro_after",                      # the minifier (docs/minifier.md)
    "repro_level": "repro_level",
    "repro_tolerance": "repro_tolerance",
    "optimize_ddp": "optimize_ddp",
}
INDUCTOR = {
    "max_autotune": "max_autotune",
    "trace.enabled": "compile_debug",                  # TORCH_COMPILE_DEBUG's knob: the debug folder
    "cpp.inject_relu_bug_TESTING_ONLY": "inject_relu_bug_TESTING_ONLY",   # the minifier's tests
    "debug": "+inductor,output_code,kernel_code",      # "print debug info and the generated code": these logs
}
_MODULES = (("torch._dynamo.config", DYNAMO), ("torch._inductor.config", INDUCTOR))

_DEFAULTS = {k: (set(v) if isinstance(v, set) else v) for k, v in config.snapshot().items()}
_applied: dict = {}     # engine knob -> (value written, the engine's value before)
_named: set = set()     # torch knobs already named in the warning


def sync() -> None:
    """Apply the torch knobs the user set (a look-up in sys.modules when none is loaded)."""
    modules = [(name, sys.modules.get(name), table) for name, table in _MODULES]
    if all(mod is None for _, mod, _ in modules):
        if _applied:
            _apply({})
        return
    wanted: dict = {}
    unsupported: list[str] = []
    for prefix, mod, table in modules:
        if mod is None:
            continue
        for name in _user_set(mod):
            target = table.get(name)
            if target is None:
                unsupported.append(f"{prefix}.{name}")
            else:
                wanted[target] = (f"{prefix}.{name}", getattr(mod, name))
    _apply(wanted)
    new = [n for n in unsupported if n not in _named]
    if new:
        _named.update(new)
        _warn(f"engine: {', '.join(new)} {'is' if len(new) == 1 else 'are'} set, but the engine has no such knob: "
              f"no effect here. docs/switches.md says what each of the guide's switches does.")


def _user_set(mod) -> list[str]:
    """The knobs of a torch config module whose value is not torch's default. torch's own
    ShapeEnv loads torch._dynamo.config, so this runs before every compile: a first pass
    keeps only the entries with a value set (about 50us for both modules), the exact
    test runs on those."""
    try:
        entries = mod._config
        unset = _UNSET
        if unset is not None:
            entries = {name: e for name, e in entries.items()
                       if e.user_override.get() is not unset or e.env_value_force is not unset
                       or e.env_value_default is not unset}
        return [name for name, entry in entries.items()
                if getattr(entry, "alias", None) is None and not mod._is_default(name)
                and getattr(mod, name) != entry.default]   # (a patch() that ended leaves the default set)
    except Exception:  # a torch whose config module works otherwise: nothing we can read
        return []


try:
    from torch.utils._config_module import _UNSET_SENTINEL as _UNSET
except ImportError:
    _UNSET = None


def _apply(wanted: dict) -> None:
    for target in set(wanted) | set(_applied):
        if "," in target:
            _apply_logs(target, wanted.get(target))
            continue
        current = getattr(config, target)
        if target in _applied:
            written, before = _applied[target]
            if current != written:           # engine.config changed since we wrote it: it wins
                del _applied[target]
                continue
            if target not in wanted:         # the torch knob went back to its default
                setattr(config, target, before)
                del _applied[target]
                continue
        elif current != _DEFAULTS.get(target):
            if target not in _said:   # said once per knob (and formatted only when a sink wants it)
                _said.add(target)
                observe.log("dynamo", logging.INFO, "engine: %s is ignored: engine.config.%s = %r was set and wins.",
                            wanted[target][0], target, current)
            continue
        torch_name, value = wanted[target]
        value = set(value) if isinstance(value, set) else value
        if current != value:
            observe.log("dynamo", logging.DEBUG, "%s = %r: engine.config.%s follows it", torch_name, value, target)
        before = _applied[target][1] if target in _applied else current
        setattr(config, target, value)
        _applied[target] = (value, before)


def _apply_logs(spec: str, wanted) -> None:
    """A knob that switches logs on (torch._inductor.config.debug): added to what is shown,
    taken away again when the knob goes back."""
    from observe import logs

    on = bool(wanted and wanted[1])
    if on and spec not in _applied:
        levels, _ = logs.parse(spec)
        added = {k: v for k, v in levels.items() if v < logs.SINK.levels.get(k, 100)}
        _applied[spec] = (added, {k: logs.SINK.levels.get(k) for k in added})
        logs.SINK.configure({**logs.SINK.levels, **added})
    elif not on and spec in _applied:
        added, before = _applied.pop(spec)
        levels = dict(logs.SINK.levels)
        for k, v in added.items():
            if levels.get(k) == v:       # not changed since (by set_logs, say)
                if before[k] is None:
                    levels.pop(k)
                else:
                    levels[k] = before[k]
        logs.SINK.configure(levels)


def reset() -> None:
    """Forget what was applied (tests): engine.config keeps its current values."""
    _applied.clear()
    _named.clear()
    _said.clear()


_said: set = set()      # engine knobs whose torch spelling was said to be ignored


def _warn(msg: str) -> None:
    observe.log("dynamo", logging.WARNING, "%s", msg)
    from .capture.convert_frame import _user_stacklevel
    warnings.warn(msg, UserWarning, stacklevel=_user_stacklevel())


# The guide's environment variables the engine does not act on, and what to use instead.
UNSUPPORTED_ENV = {
    "TORCHDYNAMO_DYNAMIC_SHAPES": "pass dynamic=True or dynamic=False to engine.compile",
    "TORCHDYNAMO_EXTENDED_DEBUG_CREATE_SYMBOL": "TORCH_LOGS=dynamic shows each symbol with the user line that made it",
    "TORCH_COMPILE_REPLAY_RECORD": "there is no record/replay: TORCH_COMPILE_DEBUG=1 keeps each frame's graphs and code",
}


def check_environment(environ=None) -> None:
    """Name the unsupported variables that are set, in one warning."""
    import os

    environ = os.environ if environ is None else environ
    found = [f"{k} ({why})" for k, why in UNSUPPORTED_ENV.items() if environ.get(k)]
    if found:
        msg = "engine: these environment variables have no effect here: " + "; ".join(found) + "."
        observe.log("dynamo", logging.WARNING, "%s", msg)
        here = os.path.dirname(os.path.abspath(__file__))
        level, f = 1, sys._getframe(0)
        while f is not None and f.f_code.co_filename.startswith((here, "<frozen")):
            # to the user's `import engine` (warnings itself skips the import machinery's frames)
            level += not f.f_code.co_filename.startswith("<frozen")
            f = f.f_back
        warnings.warn(msg, UserWarning, stacklevel=level)
