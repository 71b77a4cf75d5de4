"""`tlparse diff RUN_A RUN_B -o out/`: what changed between two runs' traces.

Each run (a TORCH_TRACE directory or one log file) gets its full report (out/run_a,
out/run_b); out/index.html (or, with --plain, out/index.txt) says what differs:
compiles added and removed per frame, graph breaks that appeared or went away,
recompile reasons, guard sets, graph op counts, kernels, and compile time per frame and
per stage, ranked by cost. Frames are matched by function name and file name (not by
frame id or line number, which move when code changes). The exit status is 1 when run
B has a graph break or a recompile that run A did not have.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from typing import Optional

from .collect import Collector
from .reader import read_records
from .report import Options, frame_name, frames_of, render_log
from .templating import render

_ADDR = re.compile(r"0x[0-9a-fA-F]+")
_TREE = re.compile(r"^[| +-]*")
_KERNEL_DEF = re.compile(r"(?:extern \"C\" void|def|^)\s*((?:cpp|triton)_\w+|kernel\d+)\s*[(=]", re.M)


@dataclasses.dataclass
class Frame:
    """One frame of one run: its compiles in order and what they left in the trace."""

    name: str
    file: str
    compiles: list = dataclasses.field(default_factory=list)       # [Compile]
    guards: list = dataclasses.field(default_factory=list)         # per compile: set of guard lines
    kernels: dict = dataclasses.field(default_factory=dict)        # kernel name -> md5 of its code

    @property
    def recompiles(self) -> int:
        return max(0, len(self.compiles) - 1)

    def time_s(self) -> float:
        return sum(c.compile_time_s() or 0.0 for c in self.compiles)


@dataclasses.dataclass
class Run:
    label: str          # "A" / "B"
    path: str
    report: str         # the run's own report directory, relative to the diff's
    col: Collector
    frames: dict        # (name, file) -> Frame
    breaks: dict        # (reason, file, code or line) -> BreakGroup


def _frame_key(c) -> tuple[str, str]:
    return frame_name(c), os.path.basename(c.co_filename or "")


def _guard_line(text: str) -> Optional[str]:
    """A guard of the tree as a comparable line: no tree chrome, addresses or user-line comment."""
    line = _TREE.sub("", text).strip()
    if not line or line.startswith(("TREE_GUARD_MANAGER", "RootGuardManager", "GuardManager:")):
        return None
    return _ADDR.sub("0x…", line.split("  # ", 1)[0].rstrip())


def _scan(paths: list[str]) -> tuple[dict, dict]:
    """(compile key -> guard lines, compile key -> {kernel name: md5}) from the raw logs."""
    guards: dict = {}
    kernels: dict = {}
    for path in paths:
        with open(path, "rb") as f:
            for rec in read_records(f):
                env = rec.envelope
                if not isinstance(env, dict) or rec.payload is None:
                    continue
                key = (env.get("compiled_autograd_id"), env.get("frame_id"), env.get("frame_compile_id"))
                text = rec.payload.decode("utf-8", "replace")
                if "dynamo_cpp_guards_str" in env:
                    guards.setdefault(key, set()).update(g for g in map(_guard_line, text.splitlines()) if g)
                art = env.get("artifact") if isinstance(env.get("artifact"), dict) else {}
                if art.get("name") == "kernel_code" or "inductor_output_code" in env:
                    ks = kernels.setdefault(key, {})
                    if art.get("kernel"):
                        ks[str(art["kernel"])] = hashlib.md5(text.encode()).hexdigest()[:8]
                    else:
                        for m in _KERNEL_DEF.finditer(text):
                            ks.setdefault(m.group(1), "")
    return guards, kernels


def load_run(label: str, logs: list[str], out: str, plain: bool) -> Run:
    sub = f"run_{label.lower()}"
    col = render_log(logs, os.path.join(out, sub), Options(plain=plain, command=f"tlparse diff ({label})",
                                                           diff_of=label))
    guards, kernels = _scan(logs)
    frames: dict = {}
    for comps in frames_of(col).values():
        for c in comps:
            fr = frames.setdefault(_frame_key(c), Frame(*_frame_key(c)))
            fr.compiles.append(c)
            fr.guards.append(guards.get(c.key, set()))
            fr.kernels.update(kernels.get(c.key, {}))
    breaks = {}
    for g in col.breaks.values():
        i = g.info
        breaks[(i.reason, os.path.basename(i.user_file or ""), i.user_code or str(i.user_line))] = g
    return Run(label, logs[0] if len(logs) == 1 else os.path.dirname(logs[0]), sub, col, frames, breaks)


@dataclasses.dataclass
class Diff:
    a: Run
    b: Run
    compiles: list = dataclasses.field(default_factory=list)    # (frame, n in A, n in B)
    breaks_new: list = dataclasses.field(default_factory=list)  # BreakGroup of B
    breaks_gone: list = dataclasses.field(default_factory=list)  # BreakGroup of A
    recompiles: list = dataclasses.field(default_factory=list)  # (frame, recompiles A, B, reasons only in B, only in A)
    guards: list = dataclasses.field(default_factory=list)      # (frame, compile index, added, removed)
    ops: list = dataclasses.field(default_factory=list)         # (frame, compile index, ops A, ops B)
    kernels: list = dataclasses.field(default_factory=list)     # (frame, added, removed, changed)
    frame_times: list = dataclasses.field(default_factory=list)  # (frame, s A, s B), by |delta|
    stage_times: list = dataclasses.field(default_factory=list)  # (stage, s A, s B), by |delta|

    @property
    def regressed(self) -> bool:
        """A graph break or a recompile that run A did not have."""
        return bool(self.breaks_new) or any(rb > ra for _, ra, rb, _, _ in self.recompiles)


def _reason(r) -> str:
    """A recompile reason with what it expected and saw, and where the guard came from."""
    text = r.guard
    if r.expected is not None and r.actual is not None and "expected" not in text:
        text += f": expected {r.expected}, got {r.actual}"
    return text + (f"  ({r.user_line})" if r.user_line else "")


def _where(key) -> str:
    return f"{key[0]} ({key[1]})" if key[1] else key[0]


def compare(a: Run, b: Run) -> Diff:
    d = Diff(a, b)
    keys = list(a.frames) + [k for k in b.frames if k not in a.frames]
    empty = Frame("", "")
    for k in keys:
        fa, fb = a.frames.get(k, empty), b.frames.get(k, empty)
        if len(fa.compiles) != len(fb.compiles):
            d.compiles.append((k, len(fa.compiles), len(fb.compiles)))
        ra = {r.guard: _reason(r) for c in fa.compiles for r in c.recompile}
        rb = {r.guard: _reason(r) for c in fb.compiles for r in c.recompile}
        if fa.recompiles != fb.recompiles or set(ra) != set(rb):
            d.recompiles.append((k, fa.recompiles, fb.recompiles, sorted(rb[g] for g in set(rb) - set(ra)),
                                 sorted(ra[g] for g in set(ra) - set(rb))))
        for i in range(min(len(fa.compiles), len(fb.compiles))):
            ga, gb = fa.guards[i], fb.guards[i]
            if ga != gb:
                d.guards.append((k, i, sorted(gb - ga), sorted(ga - gb)))
            oa, ob = fa.compiles[i].metrics.get("graph_op_count"), fb.compiles[i].metrics.get("graph_op_count")
            if oa != ob:
                d.ops.append((k, i, oa, ob))
        added = sorted(set(fb.kernels) - set(fa.kernels))
        removed = sorted(set(fa.kernels) - set(fb.kernels))
        changed = sorted(n for n in set(fa.kernels) & set(fb.kernels) if fa.kernels[n] != fb.kernels[n])
        if added or removed or changed:
            d.kernels.append((k, added, removed, changed))
        d.frame_times.append((k, fa.time_s(), fb.time_s()))
    d.breaks_new = [g for k, g in b.breaks.items() if k not in a.breaks]
    d.breaks_gone = [g for k, g in a.breaks.items() if k not in b.breaks]
    stages: dict = {}
    for run, idx in ((a, 0), (b, 1)):
        for fr in run.frames.values():
            for c in fr.compiles:
                for name, us in c.stages.items():
                    stages.setdefault(name, [0.0, 0.0])[idx] += us / 1e6
    d.stage_times = sorted(((n, t[0], t[1]) for n, t in stages.items()), key=lambda x: -abs(x[2] - x[1]))
    d.frame_times.sort(key=lambda x: -abs(x[2] - x[1]))
    return d


def _delta(x: float, y: float) -> str:
    sign = "+" if y >= x else "-"
    pct = f" ({(y - x) / x * 100:+.0f}%)" if x else ""
    return f"{sign}{abs(y - x):.4f} s{pct}"


def _break_text(g) -> str:
    i = g.info
    return f"{i.reason} at {os.path.basename(i.user_file or '?')}:{i.user_line}" + (f" | {i.user_code}" if i.user_code else "")


def render_plain(d: Diff) -> str:
    L = [f"tlparse diff: A = {d.a.path}", f"              B = {d.b.path}",
         f"verdict: {'REGRESSED: new graph breaks or recompiles in B' if d.regressed else 'no new graph break or recompile'}",
         "", "== Compiles per frame (A -> B)"]
    L += [f"{_where(k)}: {na} -> {nb} ({nb - na:+d})" for k, na, nb in d.compiles] or ["no change"]
    L += ["", "== Graph breaks"]
    L += [f"+ {_break_text(g)}" for g in d.breaks_new] + [f"- {_break_text(g)}" for g in d.breaks_gone] or ["no change"]
    L += ["", "== Recompiles (A -> B)"]
    for k, ra, rb, new, gone in d.recompiles:
        L.append(f"{_where(k)}: {ra} -> {rb} recompiles")
        L += [f"  + {r}" for r in new] + [f"  - {r}" for r in gone]
    if not d.recompiles:
        L.append("no change")
    L += ["", "== Guards that changed"]
    for k, i, added, removed in d.guards:
        L.append(f"{_where(k)} compile #{i}:")
        L += [f"  + {g}" for g in added] + [f"  - {g}" for g in removed]
    if not d.guards:
        L.append("no change")
    L += ["", "== Graph op counts (A -> B)"]
    L += [f"{_where(k)} compile #{i}: {oa} -> {ob}" for k, i, oa, ob in d.ops] or ["no change"]
    L += ["", "== Kernels"]
    for k, added, removed, changed in d.kernels:
        L += [f"{_where(k)}: + {n}" for n in added] + [f"{_where(k)}: - {n}" for n in removed]
        L += [f"{_where(k)}: ~ {n} (code changed)" for n in changed]
    if not d.kernels:
        L.append("no change")
    L += ["", "== Compile time per frame (A -> B, largest change first)"]
    L += [f"{_where(k)}: {ta:.4f} s -> {tb:.4f} s  {_delta(ta, tb)}" for k, ta, tb in d.frame_times]
    L += ["", "== Compile time per stage (A -> B, largest change first)"]
    L += [f"{n}: {ta:.4f} s -> {tb:.4f} s  {_delta(ta, tb)}" for n, ta, tb in d.stage_times]
    return "\n".join(L) + "\n"


def render_html(d: Diff) -> str:
    return render("diff.html", title="Compile diff", search=False, nav=False, d=d, where=_where,
                  break_where=lambda g: _break_text(g).split(" at ", 1)[-1], delta=_delta)


def run_diff(logs_a: list[str], logs_b: list[str], out: str, plain: bool, path_a: str, path_b: str) -> Diff:
    os.makedirs(out, exist_ok=True)
    a = load_run("A", logs_a, out, plain)
    b = load_run("B", logs_b, out, plain)
    a.path, b.path = path_a, path_b
    d = compare(a, b)
    if plain:
        with open(os.path.join(out, "index.txt"), "w", encoding="utf-8") as f:
            f.write(render_plain(d))
    else:
        # the run reports' stylesheet, for the diff page too
        from .report import write_assets
        write_assets(out)
        with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as f:
            f.write(render_html(d))
    return d
