"""Living beside torch, which reads TORCH_LOGS and TORCH_TRACE itself.

torch rejects TORCH_LOGS names it does not know and would write a second trace file of
its own internals. We import torch with both variables hidden, and if torch was imported
first we switch its logging back to quiet and drop its trace handler. This is the one
narrow use of `torch._logging` (DESIGN.md); none of our events flows through it.

The guide also tells users to call `torch._logging.set_logs(graph_breaks=True, ...)`.
That function is wrapped once torch is imported: a call configures our logs as the same
TORCH_LOGS would (and still configures torch's own loggers, as before). TORCH_LOGS, when
set, wins over such a call for both, as torch documents; we say so once, in place of
torch's warning on every call.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import warnings

_HIDDEN = ("TORCH_LOGS", "TORCH_TRACE", "TORCH_LOGS_OUT")

# set_logs names that are torch's own runtime components (not the compiler's): torch still
# shows them through its own loggers, so the engine has nothing to say about them.
_TORCH_RUNTIME_LOGS = frozenset({"autograd", "distributed", "c10d", "ddp", "fsdp", "dtensor", "onnx",
                                 "onnx_diagnostics", "export", "modules"})

_said: set = set()   # one-time notes already given (by their text)


def import_torch():
    """Import torch so that it does not act on our TORCH_LOGS / TORCH_TRACE."""
    if "torch" in sys.modules:
        import torch

        _quiet_torch_logging(torch)
        install_set_logs_hook(torch)
        return torch
    with _hidden_env():
        import torch
    _drop_trace_handler(torch)
    install_set_logs_hook(torch)
    return torch


@contextlib.contextmanager
def _hidden_env(names=_HIDDEN):
    saved = {k: os.environ.pop(k) for k in names if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _quiet_torch_logging(torch) -> None:
    if any(k in os.environ for k in _HIDDEN):
        try:
            with _hidden_env(("TORCH_LOGS",)):  # else torch warns that it ignores this very call
                torch._logging.set_logs()
        except Exception:
            pass
        _drop_trace_handler(torch)


def _drop_trace_handler(torch) -> None:
    try:
        internal = torch._logging._internal
        for handler in list(internal.trace_log.handlers):
            internal.trace_log.removeHandler(handler)
    except Exception:
        pass


# ---------------------------------------------------------------------- torch._logging.set_logs


def install_set_logs_hook(torch) -> None:
    """Make `torch._logging.set_logs(...)` configure our logs too (idempotent)."""
    module = getattr(torch, "_logging", None)
    original = getattr(module, "set_logs", None)
    if original is None or getattr(original, "_observe_original", None) is not None:
        return

    @functools.wraps(original)
    def set_logs(**settings):
        return torch_set_logs(original, torch, **settings)

    set_logs._observe_original = original
    module.set_logs = set_logs


def torch_set_logs(original, torch, **settings) -> None:
    """What a call to torch._logging.set_logs does here."""
    spec = os.environ.get("TORCH_LOGS")
    if spec is not None:
        # torch ignores the call (and warns on every one); we ignore it as well, and say so once
        shown = ", ".join(f"{k}={v!r}" for k, v in settings.items())
        _say_once(f"observe: TORCH_LOGS={spec!r} is set and takes precedence: torch._logging.set_logs({shown}) "
                  "is ignored, by torch and by the engine. Unset TORCH_LOGS to choose logs in code.")
        return
    original(**settings)     # torch's own loggers, as without us (raises on a name torch does not know)
    _drop_trace_handler(torch)
    from . import logs, registry

    ours: dict = {}
    missing: list[str] = []
    for key, value in settings.items():
        if value is None or value is False:
            continue
        if key == "all" or registry.lookup(key) is not None:
            ours[key] = value
        elif key not in _TORCH_RUNTIME_LOGS:
            missing.append(key)
    logs.set_logs(**ours)
    if missing:
        _say_once(f"observe: torch._logging.set_logs: the engine writes no {', '.join(sorted(missing))} log "
                  "(the other names are on); docs/logging.md lists the names it has.")


def _say_once(msg: str) -> None:
    """One note for the user: a WARNING on the bus (shown by the logs sink when `dynamo`
    is on, kept in traces) and a Python warning, each once per process."""
    if msg in _said:
        return
    _said.add(msg)
    from . import bus

    bus.log("dynamo", logging.WARNING, "%s", msg)
    warnings.warn(msg, UserWarning, stacklevel=4)
