"""What to fix first: one ranking of graph-break sites and recompile sites by what fixing
each would save, the same for the HTML front page and `--plain-text`.

A site's cost is the extra graphs it makes the compiler build and the seconds they took:
- a graph break: the resume functions compiled after it (one extra graph per time it
  was hit) and the analysis thrown away when the compile restarted at it;
- a recompile site (the user line a failing guard came from): every recompile it caused.
The process's warm-up (imports, first backend call, caches) lands in whichever compile
runs first and would stay if the site were fixed, so it is charged to no one: the first
compile is costed at most at the median of the others."""

from __future__ import annotations

import dataclasses
import re
import statistics
from typing import Optional

from .interpret import base_entry
from .model import Compile

TORCH_GB_DOCS = "https://meta-pytorch.github.io/compile-graph-break-site/gb/{}.html"
OUR_GB_DOCS = "docs/graph_breaks.md"
_NUMBER = re.compile(r"\b\d+\b")

# (what the failing guard says, what to do, where the docs explain it)
RECOMPILE_HINTS = [
    ("size mismatch", "The shape changes between calls: mark the dimension dynamic "
     "(engine.mark_dynamic(x, dim)) or compile with dynamic=True.", "docs/dynamic_shapes.md"),
    ("stride mismatch", "The layout changes between calls: pass contiguous tensors (x.contiguous()).",
     "docs/guards.md"),
    ("dtype mismatch", "The dtype changes between calls: cast the input to one dtype before the call.",
     "docs/guards.md"),
    ("GLOBAL_STATE", "Global state (grad mode, autocast, deterministic algorithms) changes between calls: "
     "set it once outside the compiled function.", "docs/guards.md"),
    (" == ", "A Python value the graph was specialized on changes between calls: pass it as a tensor, "
     "or make the argument dynamic.", "docs/guards.md"),
    ("ID_MATCH", "A different object is passed each call: pass the same module or function, "
     "or its tensors as arguments.", "docs/guards.md"),
]


@dataclasses.dataclass
class Fix:
    """One site worth fixing and what fixing it saves."""

    kind: str                        # "graph break" or "recompile"
    what: str                        # the break reason, or the first failing guard
    user_file: Optional[str]
    user_line: Optional[int]
    user_code: str
    hint: str                        # what to do (the break registry's hint, or ours for a guard)
    docs: str                        # where the docs explain it (a URL or a docs/ page)
    extra_graphs: int                # graphs that would not be built
    seconds: float                   # tracing + compile time of those graphs (and of thrown-away analysis)
    compiles: list = dataclasses.field(default_factory=list)   # [Compile] the extra graphs
    broke: list = dataclasses.field(default_factory=list)      # [Compile] those that broke there (a break)
    anchor: str = ""                 # where the front page details it ("break-3", "recompiles")
    group: object = None             # the BreakGroup of a graph break

    @property
    def where(self) -> str:
        if self.user_file is None:
            return ""
        return f"{self.user_file}:{self.user_line}" if self.user_line is not None else str(self.user_file)


def warmup_s(compiles: list[Compile]) -> float:
    """How much longer the process's first timed compile took than the median of the rest."""
    timed = [c for c in sorted(compiles, key=lambda c: c.order) if c.compile_time_s()]
    if len(timed) < 2:
        return 0.0
    first = timed[0].compile_time_s() or 0.0
    return max(0.0, first - statistics.median(c.compile_time_s() or 0.0 for c in timed[1:]))


def _break_docs(break_id: Optional[str]) -> str:
    if not break_id:
        return OUR_GB_DOCS
    if re.fullmatch(r"gb\d+", break_id):      # PyTorch's registry ids are lower case
        return TORCH_GB_DOCS.format(break_id)
    return f"{OUR_GB_DOCS} ({break_id})"


def _recompile_hint(guard: str) -> tuple[str, str]:
    for needle, hint, docs in RECOMPILE_HINTS:
        if needle in guard:
            return hint, docs
    return "A guard of the earlier graph failed: see the compile page for the guard and its value.", "docs/guards.md"


def _split_user_line(text: Optional[str]) -> tuple[Optional[str], Optional[int]]:
    """'prog.py:9 in f' -> ('prog.py', 9)."""
    if not text:
        return None, None
    head = text.split(" in ", 1)[0]
    file, _, line = head.rpartition(":")
    if file and line.isdigit():
        return file, int(line)
    return head, None


def rank(compiles: list[Compile], breaks: list, by_key: dict, frames: dict) -> list[Fix]:
    """`compiles`: the real compiles; `breaks`: the BreakGroups; `by_key`: compile key ->
    Compile; `frames`: (autograd id, frame id) -> compiles of that frame in order."""
    first = min(compiles, key=lambda c: c.order) if compiles else None
    warm = warmup_s(compiles)

    def charged(seconds: float, c: Compile) -> float:
        return max(0.0, seconds - warm) if c is first else seconds

    fixes: list[Fix] = []
    for g in breaks:
        info = g.info
        resumes = [by_key[k] for k in g.resume_compiles if k in by_key]
        seconds = sum(charged(c.compile_time_s() or 0.0, c) for c in resumes)
        restarted = 0
        for k in g.compiles:
            c = by_key.get(k)
            before = c.metrics.get("dynamo_time_before_restart_s") if c is not None and c.restart_reasons else None
            if isinstance(before, (int, float)):
                seconds += charged(float(before), c)
                restarted += 1
        extra = len(resumes) or len(g.compiles)   # resume compiles absent from the trace: one per break hit
        fixes.append(Fix("graph break", info.reason, info.user_file, info.user_line, info.user_code,
                         info.hints[0] if info.hints else "", _break_docs(info.break_id), extra, seconds,
                         resumes, group=g, broke=[by_key[k] for k in g.compiles if k in by_key]))
    sites: dict = {}
    for comps in frames.values():
        for prev, c in zip(comps, comps[1:]):
            rs = [r for r in c.recompile if not r.entry or base_entry(r.entry) == prev.label.strip("[]")] or c.recompile
            r = rs[0] if rs else None
            guard = r.guard if r is not None else "(no reason in the trace)"
            user = r.user_line if r is not None else None
            key = user or (c.key[0], c.key[1], _NUMBER.sub("N", guard))
            fix = sites.get(key)
            if fix is None:
                file, line = _split_user_line(user)
                hint, docs = _recompile_hint(guard)
                fix = sites[key] = Fix("recompile", guard, file, line, r.user_code if r is not None else "",
                                       hint, docs, 0, 0.0, anchor="recompiles")
            fix.extra_graphs += 1
            fix.seconds += charged(c.compile_time_s() or 0.0, c)
            fix.compiles.append(c)
    fixes.extend(sites.values())
    fixes.sort(key=lambda f: (-f.seconds, -f.extra_graphs, f.kind, f.what, f.where))
    n = 0
    for f in fixes:            # breaks are numbered in this order: the front page's break-<n> anchors
        if f.group is not None:
            f.anchor = f"break-{n}"
            n += 1
    return fixes
