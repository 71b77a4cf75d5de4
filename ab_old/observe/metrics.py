"""Compile metrics from the bus: time per compiler stage, per compile id and per compiled
user function, and the `compilation_metrics` records the compiler emits.

It listens only to compile-time events (`stage_end`, `dynamo_start`,
`compilation_metrics`, graph breaks), so a call that hits the cache costs it nothing.
`compile_times()` reads like PyTorch's compile_times():

    TorchDynamo compilation metrics:
    Function              Runtimes (s)
    --------------------  --------------
    entire_frame_compile  0.0470, 0.0123
    bytecode_tracing      0.0301, 0.0080
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Literal, Optional, Union, overload

from . import bus
from .tables import format_table

# Stages that time one user function each; they belong to the profiler's per-function
# view, not to the per-stage rows (a deep model would give hundreds of values).
PER_FUNCTION_STAGES = frozenset({"trace_function"})


@dataclasses.dataclass(frozen=True)
class FunctionKey:
    """A compiled user function: what pstats calls (filename, lineno, funcname)."""

    name: str
    filename: str
    lineno: int

    def __str__(self) -> str:
        return f"{self.name} ({_short(self.filename)}:{self.lineno})"

    @property
    def pstats_key(self) -> tuple:
        return (self.filename, self.lineno, self.name)


@dataclasses.dataclass
class CompileRecord:
    """Everything measured for one compile id (`0/1`, `2/0_1`, ...)."""

    compile_id: str
    function: Optional[FunctionKey] = None
    start_ns: Optional[int] = None
    stage_s: dict = dataclasses.field(default_factory=dict)     # stage name -> seconds (summed)
    failed_stages: list = dataclasses.field(default_factory=list)
    graph_breaks: int = 0
    metrics: dict = dataclasses.field(default_factory=dict)     # the compilation_metrics event, as emitted

    @property
    def total_s(self) -> float:
        """The frame's whole compile time: `entire_frame_compile` where it was timed,
        else the sum of the stages seen."""
        if "entire_frame_compile" in self.stage_s:
            return self.stage_s["entire_frame_compile"]
        return sum(self.stage_s.values())


@dataclasses.dataclass
class FunctionSummary:
    function: FunctionKey
    compiles: int
    total_s: float
    stage_s: dict
    graph_breaks: int
    _ids: set = dataclasses.field(default_factory=set, repr=False)


class MetricsSink:
    """Accumulates stage timings and compile records. One module-level instance (`SINK`)
    backs `compile_times()`; tests may make their own."""

    EVENTS = ["stage_end", "dynamo_start", "compilation_metrics", "graph_break"]

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.stage_times: dict[str, list[float]] = {}   # stage -> seconds, one per occurrence
            self._stage_first_start: dict[str, int] = {}     # shown outer stages first
            self._stage_parent: dict[str, Optional[str]] = {}  # stage -> the stage it ran in
            self.compiles: dict[str, CompileRecord] = {}

    def start(self) -> "MetricsSink":
        bus.subscribe(self.on_event, events=self.EVENTS)
        return self

    def stop(self) -> None:
        bus.unsubscribe(self.on_event)

    # -- the subscriber ------------------------------------------------------------------
    def on_event(self, event: bus.Event) -> None:
        md = event.metadata
        with self._lock:
            if event.name == "stage_end":
                name = md.get("name")
                seconds = md.get("duration_ns", 0) / 1e9
                if name in PER_FUNCTION_STAGES:
                    return
                if name not in self.stage_times:
                    self.stage_times[name] = []
                    self._stage_first_start[name] = event.time_ns - md.get("duration_ns", 0)
                    # stage_end is emitted after its own stage is popped: event.stage is the parent
                    self._stage_parent[name] = event.stage
                self.stage_times[name].append(seconds)
                record = self._record(event)
                if record is not None:
                    record.stage_s[name] = record.stage_s.get(name, 0.0) + seconds
                    if record.start_ns is None or name == "entire_frame_compile":
                        record.start_ns = event.time_ns - md.get("duration_ns", 0)
                    if md.get("ok") is False:
                        record.failed_stages.append(name)
            elif event.name == "dynamo_start":
                self._retire(event.compile_id)
                record = self._record(event)
                frame = compiled_function(md.get("stack"))
                if record is not None and frame is not None and record.function is None:
                    record.function = frame
            elif event.name == "compilation_metrics":
                record = self._record(event, md.get("compile_id"))
                if record is not None:
                    record.metrics = dict(md)
                    if md.get("co_name") is not None:
                        record.function = FunctionKey(md["co_name"], str(md.get("co_filename") or ""),
                                                      int(md.get("co_firstlineno") or 0))
            elif event.name == "graph_break":
                record = self._record(event)
                if record is not None:
                    record.graph_breaks += 1

    def _retire(self, compile_id: Optional[bus.CompileId]) -> None:
        """After engine.reset() compile ids start again at 0/0: a finished record under the
        same id (and its restarts) is kept under a new key instead of being merged."""
        if compile_id is None:
            return
        base = f"{compile_id.frame_id}/{compile_id.frame_compile_id}"
        for cid in [c for c in self.compiles if _base_id(c) == base]:
            if self.compiles[cid].stage_s:
                n = 1
                while f"{cid}#{n}" in self.compiles:
                    n += 1
                self.compiles[f"{cid}#{n}"] = self.compiles.pop(cid)

    def _depth(self, name: str) -> int:
        depth, seen = 0, {name}
        parent = self._stage_parent.get(name)
        while parent is not None and parent in self._stage_parent and parent not in seen:
            seen.add(parent)
            depth += 1
            parent = self._stage_parent.get(parent)
        return depth

    def _record(self, event: bus.Event, fallback_id: Optional[str] = None) -> Optional[CompileRecord]:
        cid = str(event.compile_id) if event.compile_id is not None else fallback_id
        if cid is None:
            return None
        record = self.compiles.get(cid)
        if record is None:
            record = self.compiles[cid] = CompileRecord(cid)
            first = self.compiles.get(_base_id(cid))
            if first is not None:   # a restart traces the same function
                record.function = first.function
        return record

    # -- views ---------------------------------------------------------------------------
    def per_function(self) -> list[FunctionSummary]:
        """Compile time per compiled user function, most expensive first."""
        with self._lock:
            records = list(self.compiles.values())
        grouped: dict[FunctionKey, FunctionSummary] = {}
        for r in records:
            key = r.function or FunctionKey("<unknown>", "", 0)
            s = grouped.get(key)
            if s is None:
                s = grouped[key] = FunctionSummary(key, 0, 0.0, {}, 0)
            if _base_id(r.compile_id) not in s._ids:   # a restart (`0/0_1`) is the same compile
                s._ids.add(_base_id(r.compile_id))
                s.compiles += 1
            s.total_s += r.total_s
            s.graph_breaks += r.graph_breaks
            for stage, sec in r.stage_s.items():
                s.stage_s[stage] = s.stage_s.get(stage, 0.0) + sec
        return sorted(grouped.values(), key=lambda s: -s.total_s)

    def compile_times(self, repr: str = "str", aggregate: bool = False):
        with self._lock:
            order = sorted(self.stage_times, key=self._stage_first_start.__getitem__)
            stage_times = {k: list(self.stage_times[k]) for k in order}
            depth = {k: self._depth(k) for k in order}

        def fmt(values: list[float], digits: int) -> str:
            if aggregate:
                return f"{sum(values):.{digits}f}"
            return ", ".join(f"{v:.{digits}f}" for v in values)

        if repr == "csv":
            return list(stage_times), [fmt(v, 6) for v in stage_times.values()]
        if repr != "str":
            raise ValueError(f"compile_times(repr=...) takes 'str' or 'csv', not {repr!r}")
        out = "TorchDynamo compilation metrics:\n"
        out += format_table(("Function", "Runtimes (s)"),
                            [("  " * depth[k] + k, fmt(v, 4)) for k, v in stage_times.items()], align="ll")
        functions = self.per_function()
        if functions:
            rows = []
            with self._lock:
                top = {k for k, p in self._stage_parent.items() if p in (None, "entire_frame_compile")}
            for s in functions:
                stages = ", ".join(f"{k} {v:.4f}" for k, v in s.stage_s.items()
                                   if k in top and k != "entire_frame_compile")
                rows.append((str(s.function), s.compiles, f"{s.total_s:.4f}", stages))
            out += "\n\nPer compiled function:\n"
            out += format_table(("Function", "Compiles", "Total (s)", "Stages (s)"), rows, align="lrrl")
        return out


def compiled_function(stack) -> Optional[FunctionKey]:
    """The function a compile traces: the innermost frame of dynamo_start's stack."""
    if not isinstance(stack, list) or not stack:
        return None
    frame = stack[-1]
    if not isinstance(frame, dict):
        return None
    return FunctionKey(str(frame.get("name", "<unknown>")), str(frame.get("filename", "")),
                       int(frame.get("line") or frame.get("lineno") or 0))


def _base_id(compile_id: str) -> str:
    """`0/0_1` (attempt 1 of compile 0/0) -> `0/0`; `0/0#1` (before a reset) -> `0/0#1`."""
    head, _, rest = compile_id.partition("#")
    return head.split("_", 1)[0] + (f"#{rest}" if rest else "")


def _short(filename: str) -> str:
    return filename.rsplit("/", 1)[-1] if filename else "?"


SINK = MetricsSink()


def start() -> MetricsSink:
    """Begin collecting (the engine does this on import, as PyTorch always collects)."""
    return SINK.start()


def stop() -> None:
    SINK.stop()


def reset() -> None:
    SINK.reset()


@overload
def compile_times(repr: Literal["str"] = "str", aggregate: bool = False) -> str: ...
@overload
def compile_times(repr: Literal["csv"], aggregate: bool = False) -> tuple[list[str], list[str]]: ...


def compile_times(repr: str = "str", aggregate: bool = False) -> Union[str, tuple[list[str], list[str]]]:
    """Time per compiler stage (one value per occurrence, or their sum with
    `aggregate=True`) and per compiled function. `repr="csv"` returns
    `(headers, values)` like PyTorch's."""
    return SINK.compile_times(repr, aggregate)


def compilation_records() -> list[CompileRecord]:
    """One record per compile id, in the order compiles started."""
    with SINK._lock:
        return list(SINK.compiles.values())


# Always on, as in PyTorch: it sees only compile-time events.
start()
