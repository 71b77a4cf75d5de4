"""`--plain-text`: the same report as text files that diff cleanly between two runs.

No timestamps, pids, durations or memory addresses appear in index.txt and the per-compile
files (payloads have 0x... addresses and uuids masked); everything that varies from run to
run (compile times, stage times, graph-break time costs) goes to timings.txt alone."""

from __future__ import annotations

import os
import re
import textwrap

from . import __version__, stacktrie
from .collect import Collector
from .interpret import base_entry
from .report import Options, failures, run_facts, frame_name, frame_where, frames_of, real_compiles


_RANDOM = re.compile(r"_[A-Za-z0-9_]{8}\.log$")


def _indent(text: str, by: str = "    ") -> str:
    return textwrap.indent(text, by, lambda _: True)


def write(col: Collector, out: str, opts: Options, inputs: list, fixes: list) -> None:
    comps = real_compiles(col)
    frames = frames_of(col)
    lines = [f"tlparse {__version__} plain-text report", ""]
    v = col.versions
    lines += ["== About",
              # mkstemp's random part of a trace file name changes every run
              f"inputs: {', '.join(_RANDOM.sub('_*.log', os.path.basename(p)) for p, _ in inputs)}",
              f"records: {col.records}  unparsed lines: {col.unparsed_count}",
              f"torch version: {v.get('pytorch_version') or v.get('torch_version') or 'not in the trace'}",
              f"python version (traced program): {v.get('python_version') or 'not in the trace'}",
              f"compiler config: {', '.join(sorted(col.config)) or 'not in the trace'}",
              *[f"{k}: {val}" for k, val in run_facts(col) if k in ("program", "compiler", "config", "switches") and val],
              "event kinds: " + ", ".join(f"{k}={n}" for k, n in sorted(col.counts.items())), ""]
    lines += ["== Summary",
              f"compiles: {len(comps)}  frames: {len(frames)}  distinct graph breaks: {len(col.breaks)}  "
              f"recompiles: {sum(len(x) - 1 for x in frames.values())}  "
              f"failures: {sum(1 for c in comps if c.fail_type)}  "
              f"restarts: {sum(len(c.restart_reasons) for c in comps)}", ""]
    lines.append("== What to fix first (the front page's ranking; the seconds are in timings.txt)")
    lines += fix_lines(fixes, seconds=False) or ["nothing: no graph break and no recompile"]
    lines += ["", "== Graph breaks (in the order of what to fix first)"]
    groups = [f.group for f in fixes if f.group is not None]
    for i, g in enumerate(groups, 1):
        info = g.info
        lines.append(f"{i}. {info.reason}")
        lines.append(f"   at {info.user_file}:{info.user_line}" + (f"  | {info.user_code}" if info.user_code else ""))
        if info.explanation:
            lines.append(f"   explanation: {info.explanation}")
        lines += [f"   hint: {h}" for h in info.hints]
        lines.append(f"   compiles: {' '.join(col.compiles[k].label for k in g.compiles if k in col.compiles)}"
                     f"  resumed: {' '.join(col.compiles[k].label for k in g.resume_compiles) or '-'}"
                     f"  frames caused: {g.frames_caused}")
    if not groups:
        lines.append("none")
    lines += ["", "== Recompiles"]
    any_re = False
    for cs in frames.values():
        if len(cs) < 2:
            continue
        any_re = True
        lines.append(f"{frame_name(cs[0])} ({frame_where(cs[0])}): {len(cs)} compiles")
        for i, c in enumerate(cs[1:], 1):
            prev = cs[i - 1].label.strip("[]")
            shown = [r for r in c.recompile if not r.entry or base_entry(r.entry) == prev] or c.recompile
            for r in shown:
                extra = "".join([f" expected={r.expected}" if r.expected else "", f" actual={r.actual}" if r.actual else "",
                                 f" at {r.user_line}" if r.user_line else "", f" | {r.user_code}" if r.user_code else ""])
                lines.append(f"  {c.label} entry {r.entry}: {r.guard}{extra}")
            if len(shown) < len(c.recompile):
                lines.append(f"    (+ {len(c.recompile) - len(shown)} older cache entries failed too)")
            if not c.recompile:
                lines.append(f"  {c.label}: no reason in the trace")
    if not any_re:
        lines.append("none")
    lines += ["", "== Failures and restarts"]
    fl = failures(col)
    for c, kind, reason, where in fl:
        lines.append(f"{c.label} {kind}{' at ' + where if where else ''}")
        lines.append(_indent(reason.strip()))
    if not fl:
        lines.append("none")
    if col.cache.results:   # the kernel cache per graph (the seconds saved are in timings.txt)
        lines += ["", f"== Kernel cache: {col.cache.summary()}"]
        for r in col.cache.results:
            lines.append(f"{r.compile_label} graph {r.graph} {r.status}: {', '.join(r.kernels) or 'no kernels'}")
            lines += [f"    {why}" for why in r.reasons]
    lines += ["", "== Stack trie", stacktrie.render_text(stacktrie.build(comps)) or "(empty)", ""]
    lines.append("== Compiles")
    for c in comps:
        lines.append(f"{c.label} {frame_name(c)} {c.status()} artifacts={len(c.artifacts)} -> compiles/{c.slug}.txt")
    lines += ["", f"== Unparsed lines: {col.unparsed_count}"]
    lines += [f"line {u.lineno}: {u.error}: {u.text[:200]}" for u in col.unparsed]
    _write(out, "index.txt", "\n".join(lines) + "\n")

    for c in col.compiles.values():
        _write(out, f"compiles/{c.slug}.txt", compile_text(c, col))

    t = ["Compile times (vary between runs; kept out of index.txt)", ""]
    for c in sorted(comps, key=lambda c: -(c.compile_time_s() or 0)):
        if c.compile_time_s():
            t.append(f"{c.label} {frame_name(c)}: {c.compile_time_s():.6f} s")
            for k, us in sorted(c.stages.items(), key=lambda kv: -kv[1]):
                t.append(f"    {k}: {us / 1e6:.6f} s")
    if col.cache.results:
        t += ["", f"Kernel cache: the hits saved {col.cache.saved_s:.6f} s of compiling"]
        t += [f"{r.compile_label} graph {r.graph} {r.status}: compiled in {r.compile_s:.6f} s"
              + (f", saved {r.saved_s:.6f} s" if r.saved_s is not None else "")
              for r in col.cache.results if r.compile_s is not None]
    t += ["", "What to fix first (seconds that fixing each site would save)"]
    t += fix_lines(fixes, seconds=True) or ["nothing: no graph break and no recompile"]
    _write(out, "timings.txt", "\n".join(t) + "\n")


def fix_lines(fixes: list, seconds: bool) -> list[str]:
    """The ranking of tlparse/fixfirst.py as text, one site a few lines."""
    lines = []
    for i, f in enumerate(fixes, 1):
        cost = f"{f.extra_graphs} extra graph(s)" + (f", {f.seconds:.6f} s" if seconds else "")
        lines.append(f"{i}. [{f.kind}] {f.what}  ({cost})")
        lines.append(f"   at {f.where or '(no user line in the trace)'}" + (f"  | {f.user_code}" if f.user_code else ""))
        if f.hint:
            lines.append(f"   fix: {f.hint}")
        lines.append(f"   docs: {f.docs}")
        lines.append(f"   compiles: {' '.join(c.label for c in f.compiles) or '-'}")
    return lines


def compile_text(c, col: Collector) -> str:
    lines = [f"{c.label} {frame_name(c)} ({c.status()})", f"where: {frame_where(c)}"]
    if c.stack:
        lines.append("stack:")
        lines += [f"  {fr}" + (f"  | {loc}" if loc else "") for fr, loc in c.stack]
    for r in c.recompile:
        lines.append(f"recompiled because entry {r.entry}: {r.guard}"
                     + (f" (expected {r.expected}, actual {r.actual})" if r.expected else ""))
    if c.fail_type:
        lines += [f"failure: {c.fail_type} {c.fail_where or ''}", _indent(c.fail_reason or "")]
    for r in c.restart_reasons:
        lines += ["restart:", _indent(r)]
    if c.metrics_text:
        lines += ["compilation metrics (times in timings.txt):", _indent(col.unspill(c.metrics_text))]
    if c.bwd_metrics_text:
        lines += ["backward compilation metrics:", _indent(col.unspill(c.bwd_metrics_text))]
    lines.append("artifacts:")
    lines += [f"  attempt {a.attempt}: {a.name} -> {a.url}" for a in c.artifacts]
    return "\n".join(lines) + "\n"


def _write(out: str, rel: str, text: str) -> None:
    path = os.path.join(out, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
