"""The log bus: every stage of the compiler reports here, every tool listens here.

An event is plain data. Its payload (a graph, code, a guard tree) is a callable so that
nothing is formatted unless a subscriber asks for it. With no subscriber for an event's
name or its log name, `emit` costs two dictionary look-ups and returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator, Optional

Payload = Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class CompileId:
    """`[frame_id/frame_compile_id]`, plus the restart attempt (`[0/0_1]`)."""

    frame_id: int
    frame_compile_id: int
    attempt: int = 0

    def __str__(self) -> str:
        base = f"{self.frame_id}/{self.frame_compile_id}"
        return f"{base}_{self.attempt}" if self.attempt else base


@dataclasses.dataclass
class Event:
    name: str                       # PyTorch's structured-trace key where one exists
    metadata: dict                  # small, JSON-able
    compile_id: Optional[CompileId]
    stage: Optional[str]            # the innermost `stage(...)` open when emitted
    log: Optional[str]              # TORCH_LOGS channel or artifact that shows it
    level: int                      # logging level, for channels
    time_ns: int
    payload_fn: Optional[Payload] = None
    _payload: Any = dataclasses.field(default=None, repr=False)

    def payload(self) -> Optional[str]:
        """The payload as text, built once. A payload that is not text is rendered with
        str() (or its builder's exception is reported) so a sink never crashes on it."""
        if self.payload_fn is None:
            return None
        if self._payload is None:
            try:
                value = self.payload_fn() if callable(self.payload_fn) else self.payload_fn
            except Exception as exc:  # a broken payload builder must not break the program
                value = f"<payload of {self.name} failed to render: {type(exc).__name__}: {exc}>"
            if not isinstance(value, str):
                if isinstance(value, bytes):
                    value = value.decode("utf-8", "replace")
                else:
                    value = str(value)
            self._payload = value
        return self._payload


Subscriber = Callable[[Event], None]

# key -> subscribers. Keys are event names, "log:<name>" for a log channel/artifact,
# and "*" for every event.
_subscribers: dict[str, tuple[Subscriber, ...]] = {}
# "log:<name>" -> the lowest level any subscriber of that log wants; lower levels stop in emit.
_log_levels: dict[str, int] = {}
_compile_ids: list[CompileId] = []
_stages: list[str] = []


def subscribe(fn: Subscriber, events: Optional[list[str]] = None, logs: Optional[dict[str, int] | list[str]] = None) -> Subscriber:
    """Call `fn(event)` for the named events, for events shown by the named logs, or
    (with neither) for every event. `logs` may map each log name to the lowest level
    wanted, so that lower-level lines stop in `emit`. Returns `fn` for unsubscribe."""
    wanted = logs if isinstance(logs, dict) else {name: 0 for name in logs or ()}
    keys = [*(events or []), *(f"log:{n}" for n in wanted)] or ["*"]
    for key in keys:
        current = _subscribers.get(key, ())
        if fn not in current:
            _subscribers[key] = current + (fn,)
    for name, level in wanted.items():
        key = f"log:{name}"
        _log_levels[key] = min(level, _log_levels.get(key, level))
    return fn


def unsubscribe(fn: Subscriber) -> None:
    for key in list(_subscribers):
        remaining = tuple(s for s in _subscribers[key] if s != fn)
        if remaining:
            _subscribers[key] = remaining
        else:
            del _subscribers[key]
            _log_levels.pop(key, None)


def enabled(name: str, log: Optional[str] = None) -> bool:
    """Would an event of this name (or shown by this log) reach anybody? Use it to skip
    building expensive metadata."""
    return bool(
        "*" in _subscribers
        or name in _subscribers
        or (log is not None and f"log:{log}" in _subscribers)
    )


def emit(
    name: str,
    metadata: Optional[dict] = None,
    payload: Optional[Payload] = None,
    *,
    log: Optional[str] = None,
    level: int = 20,
) -> None:
    if not _subscribers:
        return
    subs = _subscribers.get(name)
    lsubs = None
    if log is not None:
        key = "log:" + log
        if level >= _log_levels.get(key, 100):
            lsubs = _subscribers.get(key)
    every = _subscribers.get("*")
    if subs is None and lsubs is None and every is None:
        return
    event = Event(
        name=name,
        metadata=metadata if metadata is not None else {},
        compile_id=_compile_ids[-1] if _compile_ids else None,
        stage=_stages[-1] if _stages else None,
        log=log,
        level=level,
        time_ns=time.time_ns(),
        payload_fn=payload,
    )
    delivered: set[int] = set()
    for group in (subs, lsubs, every):
        for fn in group or ():
            if id(fn) in delivered:
                continue
            delivered.add(id(fn))
            try:
                fn(event)
            except Exception as exc:  # a sink's bug is reported, never raised into user code
                _report_sink_failure(fn, event, exc)


def _report_sink_failure(fn: Subscriber, event: Event, exc: Exception) -> None:
    import sys

    print(f"observe: sink {getattr(fn, '__qualname__', fn)!s} failed on event "
          f"{event.name!r}: {type(exc).__name__}: {exc}", file=sys.stderr)


def log(channel: str, level: int, msg: str, *args: Any) -> None:
    """A plain log line on a channel (`dynamo`, `aot`, ...). `msg % args` is formatted
    only when a subscriber wants it."""
    if level < _log_levels.get("log:" + channel, 100) and "*" not in _subscribers:
        return
    emit("log", {"channel": channel, "msg": msg, "args": args}, log=channel, level=level)


def current_compile_id() -> Optional[CompileId]:
    return _compile_ids[-1] if _compile_ids else None


@contextlib.contextmanager
def compile_context(compile_id: Optional[CompileId]) -> Iterator[None]:
    """Every event emitted inside carries this compile id."""
    _compile_ids.append(compile_id)
    try:
        yield
    finally:
        _compile_ids.pop()


@contextlib.contextmanager
def stage(name: str, **metadata: Any) -> Iterator[None]:
    """Time a compiler stage. Emits `stage_begin` and `stage_end` (with `duration_ns`
    and `ok`); the trace writes them as chromium events, and the profiler and metrics
    sum them. Costs two clock reads and two emits when nobody listens."""
    _stages.append(name)
    start = time.perf_counter_ns()
    emit("stage_begin", {"name": name, **metadata})
    ok = False
    try:
        yield
        ok = True
    finally:
        duration = time.perf_counter_ns() - start
        _stages.pop()
        emit("stage_end", {"name": name, "duration_ns": duration, "ok": ok, **metadata})
