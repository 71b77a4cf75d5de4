"""`CompileProfiler`: an observation-only backend that counts what the capture did.

    prof = engine.debug.CompileProfiler()
    with prof:                              # optional: also lifts the cache limit meanwhile
        fn = engine.compile(model, backend=prof)
        for batch in data:
            fn(batch)
    print(prof.report())

As a backend it runs each captured graph as is (`gm.forward`) and counts graphs and ops.
Graph breaks and recompiles it reads from the bus (`graph_break` events, or the
`dynamo_graph_break_reason` artifact; the `recompile_reasons` artifact), keeping those
of the frames it compiled, and those emitted inside its `with` block.
"""

from __future__ import annotations

import dataclasses
import textwrap
import weakref
from typing import Any, Optional

import observe
from observe.metrics import compiled_function
from observe.tables import format_table

# The cache limit used inside `with prof:` so that every recompile is seen, not cut off.
_OBSERVING_CACHE_LIMIT = 1 << 16


@dataclasses.dataclass
class _Seen:
    compile_id: Optional[observe.CompileId]
    kind: str                 # "graph_break" | "break_artifact" | "recompile"
    text: str
    where: str = ""


class CompileProfiler:
    def __init__(self) -> None:
        self.frame_count = 0          # graphs compiled (PyTorch's name)
        self.op_count = 0
        self.graphs: list[Any] = []
        self._pending: list[_Seen] = []
        self._frames: set[int] = set()       # frame ids whose graphs came to this backend
        self._functions: dict[int, str] = {}  # frame id -> "fn (file.py:4)"
        self._inside = 0
        self._unattached: list[_Seen] = []    # recompile reasons emitted before their compile id
        self._patch = None
        self._subscriber = _subscribe_weakly(self)

    # -- the backend ---------------------------------------------------------------------
    def __call__(self, gm, example_inputs):
        self.frame_count += 1
        self.op_count += sum(1 for n in gm.graph.nodes if n.op.startswith("call"))
        self.graphs.append(gm)
        cid = observe.current_compile_id()
        if cid is not None:
            self._frames.add(cid.frame_id)
        return gm.forward

    # -- `with prof:` --------------------------------------------------------------------
    def __enter__(self) -> "CompileProfiler":
        self._inside += 1
        if self._inside == 1:
            from engine import config

            self._patch = config.patch(cache_size_limit=max(config.cache_size_limit, _OBSERVING_CACHE_LIMIT))
            self._patch.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._inside -= 1
        if self._inside == 0 and self._patch is not None:
            self._patch.__exit__(None, None, None)
            self._patch = None

    def close(self) -> None:
        """Stop listening to the bus (done automatically when the profiler is collected)."""
        observe.unsubscribe(self._subscriber)

    # -- events --------------------------------------------------------------------------
    def _on_event(self, event: observe.Event) -> None:
        md = event.metadata
        cid = event.compile_id
        if event.name == "dynamo_start":
            for seen in self._unattached:      # they belong to the compile starting now
                seen.compile_id = cid
                if self._inside and cid is not None:
                    self._frames.add(cid.frame_id)
            self._unattached.clear()
            fn = compiled_function(md.get("stack"))
            if cid is not None and fn is not None:
                self._functions.setdefault(cid.frame_id, str(fn))
            return
        if event.name == "compilation_metrics":
            if cid is not None and md.get("co_name"):
                self._functions[cid.frame_id] = f"{md['co_name']} ({_short(md.get('co_filename'))}:{md.get('co_firstlineno')})"
            return
        if event.name == "graph_break":
            where = _where(md.get("user_stack"))
            seen = _Seen(cid, "graph_break", str(md.get("reason", "?")), where)
        elif event.name == "artifact" and md.get("name") == "dynamo_graph_break_reason":
            seen = _Seen(cid, "break_artifact", _break_reason_line(event.payload() or ""))
        elif event.name == "artifact" and md.get("name") == "recompile_reasons":
            seen = _Seen(cid, "recompile", _recompile_reason(event.payload() or ""))
            if cid is None:
                self._unattached.append(seen)
                self._pending.append(seen)
                return
        else:
            return
        if self._inside and cid is not None:
            self._frames.add(cid.frame_id)
        self._pending.append(seen)

    def _mine(self) -> list[_Seen]:
        return [s for s in self._pending if s.compile_id is not None and s.compile_id.frame_id in self._frames]

    # -- results -------------------------------------------------------------------------
    def graph_breaks(self) -> list[tuple[str, str]]:
        """(reason, where) of each graph break in the frames this backend compiled."""
        mine = self._mine()
        breaks = [s for s in mine if s.kind == "graph_break"]
        if not breaks:  # a capture that only writes the trace artifact
            breaks = [s for s in mine if s.kind == "break_artifact"]
        return [(s.text, s.where) for s in breaks]

    def recompiles(self) -> dict[str, list[str]]:
        """Function -> the reasons it was compiled again, in order."""
        out: dict[str, list[str]] = {}
        for s in self._mine():
            if s.kind == "recompile":
                name = self._functions.get(s.compile_id.frame_id, f"frame {s.compile_id.frame_id}")
                out.setdefault(name, []).append(s.text)
        return out

    def get_metrics(self) -> dict:
        return {"graphs": self.frame_count, "ops": self.op_count, "graph_breaks": len(self.graph_breaks()),
                "recompiles": sum(len(v) for v in self.recompiles().values())}

    def report(self) -> str:
        m = self.get_metrics()
        out = textwrap.dedent(f"""\
            Compile Profiler Report
            =======================
            Graphs compiled: {m['graphs']}   Ops: {m['ops']}   Graph breaks: {m['graph_breaks']}   Recompiles: {m['recompiles']}

            Graph Breaks
            ------------
            A graph break is where the capture met code it cannot put in a graph: the code runs
            eagerly and the rest of the function is compiled separately. Each reason below says why;
            `engine.compile(fn, fullgraph=True)` stops at the first one with its full explanation.

            """)
        counts: dict[tuple[str, str], int] = {}
        for key in self.graph_breaks():
            counts[key] = counts.get(key, 0) + 1
        if counts:
            rows = [(reason, where, n) for (reason, where), n in counts.items()]
            out += format_table(("Graph Break Reason", "Where", "Count"), rows, align="llr") + "\n"
        else:
            out += "No graph breaks detected.\n"
        out += textwrap.dedent("""
            Recompilation
            -------------
            These functions were compiled more than once because a guard failed: something the
            capture assumed constant (a shape, a dtype, a Python value) changed between calls.

            """)
        recompiles = self.recompiles()
        if recompiles:
            rows = []
            for fn, reasons in recompiles.items():
                first, *rest = reasons
                rows.append((fn, len(reasons), _first_line(first)))
                rows += [("", "", _first_line(r)) for r in rest]
            out += format_table(("Function", "Recompiles", "Recompile Reasons"), rows, align="lrl") + "\n"
            most = max(len(v) for v in recompiles.values()) + 1
            out += (f"\nSet engine.config.cache_size_limit to {most} to avoid being cache limited "
                    f"(compiles per function, the first one included).\n")
        else:
            out += "No recompilation detected.\n"
        return out


def _subscribe_weakly(prof: CompileProfiler):
    """The bus must not keep a forgotten profiler alive: the subscriber holds it weakly
    and drops itself once the profiler is gone."""
    ref = weakref.ref(prof)

    def on_event(event: observe.Event) -> None:
        target = ref()
        if target is None:
            observe.unsubscribe(on_event)
            return
        target._on_event(event)

    return observe.subscribe(on_event, events=["graph_break", "artifact", "dynamo_start", "compilation_metrics"])


def _short(filename: Any) -> str:
    return str(filename or "?").rsplit("/", 1)[-1]


def _where(user_stack: Any) -> str:
    """`file.py:12 in fn` for the innermost user frame of a break."""
    if not user_stack:
        return ""
    f = user_stack[-1]
    if isinstance(f, dict):
        return f"{_short(f.get('filename'))}:{f.get('line') or f.get('lineno')} in {f.get('name')}"
    filename, lineno, name = getattr(f, "filename", None), getattr(f, "lineno", None), getattr(f, "name", None)
    if filename is not None:
        return f"{_short(filename)}:{lineno} in {name}"
    return str(f)


def _break_reason_line(payload: str) -> str:
    """The `Graph Break Reason: ...` line of a dynamo_graph_break_reason artifact."""
    for line in payload.splitlines():
        if line.startswith("Graph Break Reason:"):
            return line.split(":", 1)[1].strip()
    return _first_line(payload)


def _recompile_reason(payload: str) -> str:
    """The first failing guard of a recompile_reasons payload: PyTorch writes the
    failures one per line (`0/0: tensor 'x' size mismatch ...`); the engine puts a
    `Recompiling function ...` header and `- ` bullets around them."""
    for line in payload.splitlines():
        text = line.strip()
        if not text or text.startswith(("Recompiling function", "triggered by")):
            continue
        return text[2:] if text.startswith("- ") else text
    return payload.strip()


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
