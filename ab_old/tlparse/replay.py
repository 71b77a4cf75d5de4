"""The trace as engine.debug.replay recorded it (`replay_record` artifacts): replay.html
shows each record as a timeline of the user's lines as the compiler traced them, one row
per run of instructions on one line, with the graph growing beside it (the nodes each row
added; a click on a row shows the graph of that capture attempt as it was then, and the
values on the stack and in the locals before the row's first instruction)."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

MAX_ROWS = 20000    # rows of one record on the page; the rest is counted, not shown


@dataclasses.dataclass
class Row:
    first: int                 # step indices, inclusive
    last: int
    compile_id: str
    depth: int
    function: str
    file: str
    line: Optional[int]
    source: str
    opnames: list
    nodes: list
    guards: list
    events: list
    stack: list                # before the first instruction
    locals: dict

    @property
    def breaks(self) -> bool:
        return any(e.startswith("graph break") for e in self.events)


@dataclasses.dataclass
class Record:
    url: str                   # the artifact's page
    steps: int
    rows: list
    inputs: dict               # compile id -> the graph inputs made before its first step
    dropped_rows: int = 0

    @property
    def breaks(self) -> int:
        return sum(1 for r in self.rows if r.breaks)


class ReplayIndex:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.bad: list[str] = []

    def add(self, payload: bytes, url: str) -> None:
        try:
            data = json.loads(payload)
            steps = data["steps"]
            rows = _rows(steps)
        except (ValueError, KeyError, TypeError) as exc:
            self.bad.append(f"{url}: {type(exc).__name__}: {exc}")
            return
        inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
        self.records.append(Record(url, len(steps), rows[:MAX_ROWS], inputs, max(0, len(rows) - MAX_ROWS)))


def _rows(steps: list) -> list[Row]:
    """Consecutive steps of one line in one call make one row."""
    rows: list[Row] = []
    for s in steps:
        key = (s["compile_id"], s["depth"], s["function"], s["filename"], s["lineno"])
        last = rows[-1] if rows else None
        if last is None or (last.compile_id, last.depth, last.function, last.file, last.line) != key \
                or last.events:
            last = Row(s["index"], s["index"], *key, s["source"], [], [], [], [], list(s["stack"]),
                       dict(s["locals"]))
            rows.append(last)
        last.last = s["index"]
        last.opnames.append(s["opname"])
        last.nodes.extend(s.get("nodes") or ())
        last.guards.extend(s.get("guards") or ())
        if s.get("event"):
            last.events.append(s["event"])
    return rows


def _panel_data(record: Record) -> dict:
    """What the page's script needs: per row its attempt, how many of the attempt's nodes
    exist after it, and its stack and locals; per attempt all its nodes in order."""
    nodes: dict[str, list] = {cid: list(v) for cid, v in record.inputs.items()}
    rows = []
    for r in record.rows:
        graph = nodes.setdefault(r.compile_id, [])
        graph.extend(r.nodes)
        rows.append({"c": r.compile_id, "n": len(graph), "s": r.stack, "l": r.locals})
    return {"rows": rows, "graphs": nodes}


def write_page(index: ReplayIndex, out: str, render) -> Optional[str]:
    """replay.html, or None when the trace holds no replay record."""
    if not index.records and not index.bad:
        return None
    html = render("replay.html", title="Replay of the trace", records=index.records, bad=index.bad,
                  data=[_panel_data(r) for r in index.records], basename=os.path.basename)
    with open(os.path.join(out, "replay.html"), "w", encoding="utf-8") as f:
        f.write(html)
    return "replay.html"
