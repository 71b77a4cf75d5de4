"""The compile-time profiler: where did compile time go, per traced user function.

    TORCH_COMPILE_DYNAMO_PROFILER=1 python script.py          # a table at exit, on stdout
    TORCH_COMPILE_DYNAMO_PROFILER=/tmp/c.prof python script.py  # a pstats file for snakeviz

It is built from the bus's stage timers only: each `stage_begin`/`stage_end` pair is one
call in a call tree. `bytecode_tracing` is a call of the compiled user function (named
from `dynamo_start`), `trace_function` a call of an inlined user function (named from its
metadata), and every other stage (`backend_compile`, `aot_*`, `codegen`, ...) a call of
the engine named `<stage>`. From the tree come pstats rows keyed (filename, lineno,
funcname) with cumulative and own time, so snakeviz draws user functions, not only
the engine's internals. With `ENGINE_PROFILER_INTERNALS=1` a real cProfile of the
engine runs during each compile and is merged into the same stats.

The profiler times only its own callbacks, and reports that overhead; when it is off it
is not subscribed and nothing is timed beyond the stage timers themselves.
"""

from __future__ import annotations

import atexit
import cProfile
import dataclasses
import io
import marshal
import os
import pstats
import sys
import time
from typing import IO, Optional

from . import bus
from .metrics import compiled_function
from .tables import format_table, render_rich_table, wants_color, write

Key = tuple  # (filename, lineno, funcname), pstats' function key

ENGINE_FILE = "<engine>"
ROOT_STAGES = frozenset({"bytecode_tracing"})


@dataclasses.dataclass
class _Frame:
    key: Key
    is_user: bool
    child_ns: int = 0
    primitive: bool = True        # not already on the stack (pstats' "primitive call")
    is_root: bool = False         # the compiled function (its bytecode_tracing stage)
    merged: bool = False          # a trace_function that repeats its root's bytecode_tracing


@dataclasses.dataclass
class Timing:
    """One call: what cProfile would record on the function's return."""

    key: Key
    is_user: bool
    cum_ns: int
    own_ns: int
    caller: Optional[Key]
    primitive: bool


@dataclasses.dataclass
class Row:
    key: Key
    is_user: bool
    calls: int
    primitive_calls: int
    cum_s: float
    own_s: float

    @property
    def label(self) -> str:
        filename, lineno, name = self.key
        if not self.is_user:
            return name
        return f"{name} ({filename.rsplit('/', 1)[-1]}:{lineno})"


class ProfilerSink:
    EVENTS = ["stage_begin", "stage_end", "dynamo_start"]

    def __init__(self, output: Optional[str] = None, internals: bool = False) -> None:
        self.output = output
        self.internals = internals
        self.timings: list[Timing] = []
        self.stack: list[_Frame] = []
        self.roots: dict[tuple, Key] = {}    # (frame id, compile index) -> the compiled user function
        self.total_ns = 0                    # time under outermost stages: the compile time seen
        self.overhead_ns = 0
        self.events = 0
        self._cprofile: Optional[cProfile.Profile] = None
        self._real_stats: Optional[pstats.Stats] = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "ProfilerSink":
        bus.subscribe(self.on_event, events=self.EVENTS)
        return self

    def stop(self) -> None:
        bus.unsubscribe(self.on_event)
        if self._cprofile is not None:
            self._cprofile.disable()
            self._collect_cprofile()

    # -- the subscriber ------------------------------------------------------------------
    def on_event(self, event: bus.Event) -> None:
        t0 = time.perf_counter_ns()
        try:
            if event.name == "stage_begin":
                self._begin(event)
            elif event.name == "stage_end":
                self._end(event)
            else:  # dynamo_start names the function this compile traces
                fn = compiled_function(event.metadata.get("stack"))
                if fn is not None and event.compile_id is not None:
                    self.roots[_frame_compile(event.compile_id)] = fn.pstats_key
        finally:
            self.events += 1
            self.overhead_ns += time.perf_counter_ns() - t0

    def _key_of(self, event: bus.Event) -> tuple[Key, bool]:
        md = event.metadata
        name = md.get("name")
        if name == "trace_function" or (name in ROOT_STAGES and md.get("fn_name")):
            return (str(md.get("filename", "")), int(md.get("lineno") or 0), str(md.get("fn_name", "?"))), True
        if name in ROOT_STAGES:
            root = self.roots.get(_frame_compile(event.compile_id)) if event.compile_id is not None else None
            if root is not None:
                return root, True
        return (ENGINE_FILE, 0, f"<{name}>"), False

    def _begin(self, event: bus.Event) -> None:
        key, is_user = self._key_of(event)
        top = self.stack[-1] if self.stack else None
        # The interpreter may time the root function both as bytecode_tracing and as its
        # first trace_function: that is one call, not a recursion.
        name = event.metadata.get("name")
        merged = (top is not None and top.is_root and top.key == key and name == "trace_function"
                  and top.child_ns == 0)
        primitive = not any(f.key == key for f in self.stack)
        self.stack.append(_Frame(key, is_user, primitive=primitive, merged=merged,
                                 is_root=is_user and name in ROOT_STAGES))
        if len(self.stack) == 1 and self.internals:
            self._cprofile = self._cprofile or cProfile.Profile()
            self._cprofile.enable()

    def _end(self, event: bus.Event) -> None:
        if not self.stack:
            return
        frame = self.stack.pop()
        duration = int(event.metadata.get("duration_ns", 0))
        if frame.merged:
            return
        caller = self.stack[-1] if self.stack else None
        if caller is not None and caller.merged:  # attribute to the root it stands for
            caller = self.stack[-2] if len(self.stack) > 1 else None
        self.timings.append(Timing(frame.key, frame.is_user, duration, max(0, duration - frame.child_ns),
                                   caller.key if caller else None, frame.primitive))
        if caller is not None:
            caller.child_ns += duration
        if not self.stack:
            self.total_ns += duration
            if self._cprofile is not None:
                self._cprofile.disable()

    # -- results -------------------------------------------------------------------------
    def rows(self) -> list[Row]:
        table: dict[Key, Row] = {}
        for t in self.timings:
            row = table.get(t.key)
            if row is None:
                row = table[t.key] = Row(t.key, t.is_user, 0, 0, 0.0, 0.0)
            row.calls += 1
            row.own_s += t.own_ns / 1e9
            if t.primitive:
                row.primitive_calls += 1
                row.cum_s += t.cum_ns / 1e9
        return sorted(table.values(), key=lambda r: -r.cum_s)

    def stats_dict(self) -> dict:
        """pstats' raw dict: key -> (primitive calls, calls, own s, cumulative s, callers),
        callers: key -> (calls, primitive calls, own s, cumulative s)."""
        stats: dict = {}
        edges: dict = {}
        for row in self.rows():
            edges[row.key] = {}
            stats[row.key] = [row.primitive_calls, row.calls, row.own_s, row.cum_s]
        for t in self.timings:
            if t.caller is None:
                continue
            e = edges[t.key].setdefault(t.caller, [0, 0, 0.0, 0.0])
            e[0] += 1
            e[1] += 1 if t.primitive else 0
            e[2] += t.own_ns / 1e9
            e[3] += t.cum_ns / 1e9
        overhead = (ENGINE_FILE, 0, "<profiler overhead>")
        out = {k: (v[0], v[1], v[2], v[3], {c: tuple(e) for c, e in edges[k].items()}) for k, v in stats.items()}
        if self.overhead_ns:
            out[overhead] = (self.events, self.events, self.overhead_ns / 1e9, self.overhead_ns / 1e9, {})
        return out

    def stats(self) -> pstats.Stats:
        """The profile as a `pstats.Stats` (merged with the real cProfile when enabled)."""
        empty = cProfile.Profile()
        empty.enable()  # pstats refuses a profile that recorded nothing
        empty.disable()
        stats = pstats.Stats(empty, stream=io.StringIO())
        stats.stats = self.stats_dict()  # type: ignore[attr-defined]
        stats.total_calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
        stats.prim_calls = sum(v[0] for v in stats.stats.values())  # type: ignore[attr-defined]
        stats.total_tt = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
        real = self._collect_cprofile()
        if real is not None:
            stats.add(real)
        return stats

    def _collect_cprofile(self) -> Optional[pstats.Stats]:
        if self._cprofile is not None:
            try:
                self._real_stats = pstats.Stats(self._cprofile, stream=io.StringIO())
            except TypeError:  # never enabled: nothing recorded
                self._real_stats = None
        return self._real_stats

    def dump(self, path: str) -> None:
        """Write a .prof file that `pstats.Stats(path)` and `snakeviz path` open."""
        stats = self.stats()
        with open(path, "wb") as f:
            marshal.dump(stats.stats, f)  # what pstats.Stats.dump_stats writes

    def report(self, color: bool = False, width: Optional[int] = None) -> str:
        """The table printed at exit."""
        rows = self.rows()
        total_s = self.total_ns / 1e9
        user = [r for r in rows if r.is_user]
        engine = [r for r in rows if not r.is_user]
        traced_s = sum(r.own_s for r in user)

        def share(seconds: float) -> str:
            return f"{100.0 * seconds / total_s:.1f}%" if total_s else "-"

        def ms(seconds: float) -> str:
            return f"{seconds * 1e3:.2f}"

        headers = ("Function", "Calls", "Cumulative (ms)", "Own (ms)", "Share")
        urows = [(r.label, _calls(r), ms(r.cum_s), ms(r.own_s), share(r.cum_s)) for r in user]
        erows = [(r.label, _calls(r), ms(r.cum_s), ms(r.own_s), share(r.cum_s)) for r in engine]
        overhead_s = self.overhead_ns / 1e9
        footer = (f"Total compile time {ms(total_s)} ms; tracing user functions {ms(traced_s)} ms ({share(traced_s)}). "
                  f"Profiler overhead {ms(overhead_s)} ms ({share(overhead_s)}) in {self.events} events.")
        if self._real_stats is not None or self.internals:
            footer += " Times include cProfile's own overhead (ENGINE_PROFILER_INTERNALS=1)."
        if color:
            out = render_rich_table("Compile time per traced user function", headers, urows or [("(none)", "", "", "", "")],
                                    width=width)
            out += render_rich_table("Compile time per engine stage", headers, erows or [("(none)", "", "", "", "")],
                                     caption=footer, width=width)
            return out
        out = "Compile time per traced user function:\n"
        out += format_table(headers, urows, align="lrrrr") if urows else "(no user function was traced)"
        out += "\n\nCompile time per engine stage:\n"
        out += format_table(headers, erows, align="lrrrr") if erows else "(no stage was timed)"
        return out + "\n\n" + footer + "\n"

    def finish(self, stream: Optional[IO[str]] = None) -> None:
        """At exit: write the .prof (if a path was given) or print the table."""
        self.stop()
        stream = stream or sys.stdout
        if not self.timings:
            print("observe: TORCH_COMPILE_DYNAMO_PROFILER is set but nothing was compiled; no compile profile.",
                  file=sys.stderr)
            return
        if self.output:
            try:
                self.dump(self.output)
            except OSError as exc:
                print(f"observe: could not write the compile profile to {self.output!r}: {exc}", file=sys.stderr)
                return
            print(f"observe: compile profile written to {self.output} ({len(self.timings)} calls timed, "
                  f"profiler overhead {self.overhead_ns / 1e6:.2f} ms); open it with: snakeviz {self.output}",
                  file=sys.stderr)
            return
        write(self.report(color=wants_color(stream)), stream)


def _frame_compile(compile_id) -> tuple:
    """A restart (attempt 1 of `0/0`) traces the function `dynamo_start` named for `0/0`."""
    return (compile_id.frame_id, compile_id.frame_compile_id)


def _calls(row: Row) -> str:
    return str(row.calls) if row.calls == row.primitive_calls else f"{row.calls}/{row.primitive_calls}"


SINK: Optional[ProfilerSink] = None


def start(output: Optional[str] = None, internals: bool = False, at_exit: bool = True) -> ProfilerSink:
    """Profile every compile from now on; at exit print the table, or write `output`."""
    global SINK
    stop()
    SINK = ProfilerSink(output, internals).start()
    if at_exit:
        atexit.register(_finish_at_exit, SINK)
    return SINK


def stop() -> None:
    global SINK
    if SINK is not None:
        SINK.stop()
        SINK = None


def _finish_at_exit(sink: ProfilerSink) -> None:
    if sink is SINK:
        sink.finish()


def parse_env(value: Optional[str]) -> tuple[bool, Optional[str]]:
    """TORCH_COMPILE_DYNAMO_PROFILER: 1/true -> print a table; 0/false/empty -> off;
    anything else is the .prof path."""
    if value is None:
        return False, None
    v = value.strip()
    if v.lower() in ("", "0", "false", "no", "off"):
        return False, None
    if v.lower() in ("1", "true", "yes", "on"):
        return True, None
    return True, v


def configure_from_env() -> None:
    on, path = parse_env(os.environ.get("TORCH_COMPILE_DYNAMO_PROFILER"))
    if on:
        start(path, internals=os.environ.get("ENGINE_PROFILER_INTERNALS", "0") == "1")
