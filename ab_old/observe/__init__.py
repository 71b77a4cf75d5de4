"""observe: the log bus and its sinks (logs, trace, profiler, metrics).

Depends on nothing else in this repository. Importing it reads TORCH_LOGS,
TORCH_TRACE and TORCH_COMPILE_DYNAMO_PROFILER."""

import os

from .bus import (CompileId, Event, compile_context, current_compile_id, emit, enabled, log, stage,
                  subscribe, unsubscribe)
from .logs import set_logs
from . import logs as _logs, trace as _trace

__all__ = ["CompileId", "Event", "compile_context", "current_compile_id", "emit", "enabled", "log",
           "stage", "subscribe", "unsubscribe", "set_logs"]

_logs.configure_from_env()
_trace.configure_from_env()
if os.environ.get("TORCH_COMPILE_DYNAMO_PROFILER"):  # imported only when asked for
    from . import profiler as _profiler
    _profiler.configure_from_env()
