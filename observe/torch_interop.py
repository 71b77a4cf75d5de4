"""Living beside torch, which reads TORCH_LOGS and TORCH_TRACE itself.

torch rejects TORCH_LOGS names it does not know and would write a second trace file of
its own internals. We import torch with both variables hidden, and if torch was imported
first we switch its logging back to quiet and drop its trace handler. This is the one
narrow use of `torch._logging` (DESIGN.md); none of our events flows through it.
"""

from __future__ import annotations

import os
import sys

_HIDDEN = ("TORCH_LOGS", "TORCH_TRACE", "TORCH_LOGS_OUT")


def import_torch():
    """Import torch so that it does not act on our TORCH_LOGS / TORCH_TRACE."""
    if "torch" in sys.modules:
        import torch

        _quiet_torch_logging(torch)
        return torch
    saved = {k: os.environ.pop(k) for k in _HIDDEN if k in os.environ}
    try:
        import torch
    finally:
        os.environ.update(saved)
    _drop_trace_handler(torch)
    return torch


def _quiet_torch_logging(torch) -> None:
    if any(k in os.environ for k in _HIDDEN):
        try:
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
