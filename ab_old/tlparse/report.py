"""Build a report: stream each log through a Collector, then write the front page, one
page per compile, the search page and the machine-readable exports."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from typing import Optional

from . import __version__, assets, cache_report, fixfirst, pictures, provenance, replay, stacktrie
from .collect import Collector, SearchWriter
from .interpret import base_entry, resume_target
from .model import Compile
from .html_util import fmt_seconds
from .templating import render

SLOWEST = 15


@dataclasses.dataclass
class Options:
    plain: bool = False
    command: str = ""
    diff_of: Optional[str] = None     # "A" or "B" when this report is one run of a `tlparse diff`


def render_log(paths: list[str], out: str, opts: Options, rank: Optional[int] = None) -> Collector:
    """One report (one process or rank) from one or more log files, into `out`."""
    os.makedirs(out, exist_ok=True)
    for sub in ("compiles", "artifacts") + (() if opts.plain else ("pictures",)):  # artifacts/ is flat
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    search = None
    if not opts.plain:
        write_assets(out)
        search = SearchWriter(out)
    with open(os.path.join(out, "raw.jsonl"), "wb") as raw, \
            open(os.path.join(out, "chromium_events.json"), "wb") as timeline:
        timeline.write(b"[\n")
        col = Collector(out, plain=opts.plain, search=search, timeline=timeline, raw=raw, rank=rank)
        for path in paths:
            with open(path, "rb") as f:
                col.consume_stream(f)
        timeline.write(b"\n]\n")
    col.finish()
    _add_actuals(col)
    fixes = fix_ranking(col)
    inputs = [(p, os.path.getsize(p)) for p in paths]
    if opts.plain:
        from . import plaintext
        plaintext.write(col, out, opts, inputs, fixes)
    else:
        _index_search(col, fixes)
        col.search.flush()
        write_compile_pages(col, out, fixes)
        provenance.write_page(col.provenance, out, render)
        cache_report.write_page(col.cache, out, render)
        replay.write_page(col.replays, out, render)
        write_index(col, out, opts, inputs, rank, fixes)
        write_search_page(out, col.search)
    write_directory(col, out, opts.plain)
    col.close()
    return col


def write_assets(out: str) -> None:
    os.makedirs(os.path.join(out, "assets"), exist_ok=True)
    with open(os.path.join(out, "assets", "report.css"), "w", encoding="utf-8") as f:
        f.write(assets.CSS)
    with open(os.path.join(out, "assets", "report.js"), "w", encoding="utf-8") as f:
        f.write(assets.JS)


# ---- helpers shared by the pages
def frame_name(c: Compile) -> str:
    if c.co_name:
        return str(c.co_name)
    if c.stack:
        return c.stack[-1][0].rsplit(" in ", 1)[-1]
    return "?"


def frame_where(c: Compile) -> str:
    if c.co_filename:
        return f"{c.co_filename}:{c.co_firstlineno}"
    if c.stack:
        return c.stack[-1][0].rsplit(" in ", 1)[0]
    return ""


def real_compiles(col: Collector) -> list[Compile]:
    return sorted((c for c in col.compiles.values() if c.key != (None, None, None)), key=_sort_key)


def _sort_key(c: Compile):
    caid, fid, fcid = c.key
    return (-1 if caid is None else caid, -1 if fid is None else fid, -1 if fcid is None else fcid)


def frames_of(col: Collector) -> dict:
    """(compiled autograd id, frame id) -> its compiles, in compile order."""
    frames: dict = {}
    for c in real_compiles(col):
        frames.setdefault((c.key[0], c.key[1]), []).append(c)
    return frames


def _add_actuals(col: Collector) -> None:
    """PyTorch names only the expected value of a failing `x == v` guard; the value it saw
    is what the next compile of the frame guarded on: fill `actual` from there."""
    for comps in frames_of(col).values():
        for i, c in enumerate(comps[:-1]):
            later = comps[i + 1]
            for r in c.recompile:
                if r.actual is not None or r.expected is None or " == " not in r.guard:
                    continue
                lhs = r.guard.split(" == ", 1)[0].strip()
                for r2 in later.recompile:
                    if base_entry(r2.entry) == c.label.strip("[]") and r2.guard.split(" == ", 1)[0].strip() == lhs:
                        r.actual = r2.expected
                        break


def failures(col: Collector) -> list[tuple[Compile, str, str, str]]:
    """(compile, kind, reason, where) for each failure and each restart."""
    out = []
    for c in real_compiles(col):
        if c.fail_type:
            out.append((c, c.fail_type, c.fail_reason or "", c.fail_where or ""))
        for r in c.restart_reasons:
            out.append((c, "restart", r, ""))
    return out


def fix_ranking(col: Collector) -> list:
    """What to fix first (tlparse/fixfirst.py): the one order of the front page, the graph
    breaks' anchors and `--plain-text`."""
    return fixfirst.rank(real_compiles(col), list(col.breaks.values()), col.compiles, frames_of(col))


def ranked_breaks(fixes: list) -> list:
    """The graph breaks' fixes, in ranking order (their anchors are break-0, break-1, ...)."""
    return [f for f in fixes if f.group is not None]


def _index_search(col: Collector, fixes: list) -> None:
    s = col.search
    for c in real_compiles(col):
        s.add("frame", f"{c.label} {frame_name(c)}", f"compiles/{c.slug}.html",
              " \n".join([frame_where(c)] + [f"{fr} {loc}" for fr, loc in c.stack]))
        for r in c.recompile:
            s.add("recompile", f"{c.label} {frame_name(c)}: {r.guard}", f"compiles/{c.slug}.html",
                  f"{r.guard}\n{r.user_line or ''}\n{r.user_code}")
        if c.fail_type:
            s.add("failure", f"{c.label} {c.fail_type}", f"compiles/{c.slug}.html", c.fail_reason or "")
    for f in ranked_breaks(fixes):
        info = f.group.info
        s.add("graph break", f"{info.reason} at {info.user_file}:{info.user_line}", f"index.html#{f.anchor}",
              "\n".join([info.explanation, *info.hints, info.user_code, *info.user_stack]))


# ---- compile pages
QUICK = [("graph", ("dynamo_output_graph",)), ("guards", ("dynamo_cpp_guards_str", "dynamo_guards", "guards")),
         ("original bytecode", ("_ORIGINAL_BYTECODE",)), ("modified bytecode", ("_MODIFIED_BYTECODE",)),
         ("AOT joint", ("aot_joint_graph",)), ("AOT forward", ("aot_forward_graph",)),
         ("AOT backward", ("aot_backward_graph",)), ("AOT inference", ("aot_inference_graph",)),
         ("output code", ("inductor_output_code", "output_code")), ("kernels", ("kernel_code", "kernel")),
         ]


def _quick_kind(name: str) -> Optional[str]:
    for label, names in QUICK:
        for n in names:
            if name == n or (n.startswith("_") and name.endswith(n)) or (n == "kernel" and "kernel" in name):
                return label
    return None


_QUICK_CACHE: dict = {}


def _quick_links(c: Compile) -> list[tuple[str, Optional[str]]]:
    """(label, url or None) for each kind of artifact a compile page links at the top."""
    first: dict = {}
    for a in c.artifacts:
        kind = _QUICK_CACHE.get(a.name, 0)
        if kind == 0:
            kind = _QUICK_CACHE[a.name] = _quick_kind(a.name)
        if kind is not None and kind not in first:
            first[kind] = a
    items = [(label, f"../{first[label].url}" if label in first else None) for label, _ in QUICK]
    if c.metrics_text:
        items.append(("metrics", "#compilation_metrics"))
    if any(a.name == "kernel_provenance" for a in c.artifacts):
        items.append(("kernels <-> lines", f"../kernels.html#c-{c.slug}"))
    return items


METRIC_KEYS = ["entire_frame_compile_time_s", "backend_compile_time_s", "inductor_compile_time_s",
               "code_gen_time_s", "dynamo_time_before_restart_s", "guard_count", "shape_env_guard_count",
               "graph_op_count", "graph_node_count", "graph_input_count", "cache_size", "accumulated_cache_size",
               "has_guarded_code", "fail_type"]


def write_compile_pages(col: Collector, out: str, fixes: list) -> None:
    frames = frames_of(col)
    anchors = {(f.group.info.user_file, f.group.info.user_line, f.group.info.reason): f.anchor.split("-", 1)[1]
               for f in ranked_breaks(fixes)}
    layouts: dict = {}     # a trace that repeats a graph lays it out once
    for c in col.compiles.values():
        total = c.top_us or None
        pic = pic_url = None
        shape = col.graph_shapes.get(c.key)
        if shape is not None:
            kernels = col.kernel_of.get(c.key) or {}
            cut = None
            if c.breaks:
                info = col.breaks[c.breaks[0]].info
                cut = f"{info.reason} at line {info.user_line}" if info.user_line else info.reason
            lkey = (id(shape), tuple(sorted(kernels.items())), cut)
            pic, pic_url = layouts.get(lkey) or (None, None)
            if pic is None:
                pic = pictures.layout_graph(shape, kernels, cut)
                pic_url = f"pictures/graph_{len(layouts)}.svg"
                layouts[lkey] = (pic, pic_url)
                if not pic.too_big:
                    col.files.submit(os.path.join(out, pic_url), render("graph.svg", pic=pic))
        stages = [(k, fmt_seconds(v / 1e6), f"{100 * v / total:.0f}%" if total else "")
                  for k, v in sorted(c.stages.items(), key=lambda kv: -kv[1])]
        html = render(
            "compile.html", depth=1, title=f"{c.label} {frame_name(c)}", c=c, frame=frame_name(c),
            where=frame_where(c), resumed=bool(resume_target(c.co_name)),
            siblings=frames.get((c.key[0], c.key[1]), []),
            quick=_quick_links(c) if c.key != (None, None, None) else [],
            stack_text="\n".join(f"{fr}\n    {loc}" if loc else fr for fr, loc in c.stack),
            breaks=[(anchors[gk], col.breaks[gk].info) for gk in c.breaks],
            metrics=[(k, _fmt_metric(c.metrics.get(k))) for k in METRIC_KEYS if k in c.metrics],
            metrics_text=col.unspill(c.metrics_text), bwd_metrics_text=col.unspill(c.bwd_metrics_text),
            stages=stages, events_text="\n".join(f"{a} {ln:>6} {n} {col.unspill(ref).strip()}"
                                                  for a, n, ln, ref in c.events),
            pic=pic, pic_url=pic_url, max_nodes=pictures.MAX_NODES)
        col.files.submit(os.path.join(out, "compiles", f"{c.slug}.html"), html)


def _fmt_metric(v) -> str:
    if isinstance(v, float):
        return f"{v:.6f}".rstrip("0").rstrip(".")
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return "" if v is None else str(v)


# ---- front page
def recompile_rows(cs: list[Compile]) -> list[tuple]:
    """(compile, reason or None, n older entries) rows of one frame's recompiles: the reasons
    against the previous compile; older cache entries that failed too are one summary row."""
    rows = []
    for prev, c in zip(cs, cs[1:]):
        rs = [r for r in c.recompile if not r.entry or base_entry(r.entry) == prev.label.strip("[]")] or c.recompile
        if not rs:
            rows.append((c, None, 0))
        elif len(rs) < len(c.recompile):
            rows.append((c, None, len(c.recompile) - len(rs)))
        rows += [(c, r, 0) for r in rs]
    return rows


def _largest_stages(c: Compile) -> str:
    """The three largest stages under the outermost one, for the slowest-compiles table."""
    top = sorted(c.stages.items(), key=lambda kv: -kv[1])[1:4]
    return ", ".join(f"{k} {fmt_seconds(v / 1e6)}" for k, v in top)


def write_index(col: Collector, out: str, opts: Options, inputs: list, rank: Optional[int], fixes: list) -> None:
    comps = real_compiles(col)
    frames = frames_of(col)
    fails = failures(col)
    breaks = ranked_breaks(fixes)
    recompiled = {k: v for k, v in frames.items() if len(v) > 1}
    total_time = sum(c.compile_time_s() or 0 for c in comps)
    n_fail = sum(1 for c in comps if c.fail_type)
    n_restart = sum(len(c.restart_reasons) for c in comps)
    title = "Compile report" + (f" — rank {rank}" if rank is not None else "")
    cards = [("compiles", len(comps), False), ("frames", len(frames), False),
             ("distinct graph breaks", len(breaks), bool(breaks)),
             ("recompiles", sum(len(v) - 1 for v in recompiled.values()), bool(recompiled)),
             ("failures", n_fail, bool(n_fail)), ("restarts", n_restart, bool(n_restart)),
             ("compile time", fmt_seconds(total_time) or "0", False),
             ("unparsed lines", col.unparsed_count, bool(col.unparsed_count))]
    timed = sorted((c for c in comps if c.compile_time_s()), key=lambda c: -(c.compile_time_s() or 0))[:SLOWEST]
    glob = col.compiles.get((None, None, None))
    html = render(
        "index.html", title=title, col=col, diff_of=opts.diff_of, rank=rank, cards=cards,
        run_rows=run_rows(col), dynamo_configs=col.dynamo_configs,
        knobs=[(n, json.dumps(x, default=str)) for n, x in sorted(config_knobs(col).items())],
        chart=pictures.time_chart(comps, col.stage_depth), fixes=fixes, warmup=fixfirst.warmup_s(comps),
        breaks=breaks, recompiled=[(cs, recompile_rows(cs)) for cs in recompiled.values()], fails=fails,
        slowest=[(c, _largest_stages(c)) for c in timed],
        root=stacktrie.build(comps), href=lambda c: f"compiles/{c.slug}.html", comps=comps,
        has_global=glob is not None and bool(glob.artifacts), about_rows=about(col, opts, inputs),
        config_links=sorted(col.config.items()), frame_name=frame_name, frame_where=frame_where)
    with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as f:
        f.write(html)


def config_knobs(col: Collector) -> dict:
    """The compiler config of the run's first compile (`dynamo_config` of compilation_metrics)."""
    try:
        value = json.loads(col.dynamo_config) if col.dynamo_config else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def run_facts(col: Collector) -> list[tuple[str, str]]:
    """What ran, as the trace says it: program, compiler and versions, config, switches."""
    v = col.versions
    argv = v.get("argv")
    program = " ".join(["python"] + [str(a) for a in argv]) if isinstance(argv, list) and argv else ""
    if v.get("engine"):
        compiler = f"{v.get('engine')} {v.get('engine_version') or '(version not in the trace)'}"
    elif v.get("pytorch_version"):
        compiler = "torch.compile"
    else:
        compiler = "not in the trace"
    torch_v = str(v.get("pytorch_version") or v.get("torch_version") or "not in the trace")
    if v.get("commit"):
        torch_v += f" (commit {str(v.get('commit'))[:12]})"
    knobs = config_knobs(col)
    cfg = f"{len(knobs)} knobs" if knobs else "not in the trace"
    if len(col.dynamo_configs) > 1:
        cfg += f"; changed during the run: {len(col.dynamo_configs)} distinct configs"
    env = v.get("env") if isinstance(v.get("env"), dict) else {}
    return [("program", program or "not in the trace"), ("working directory", str(v.get("cwd") or "")),
            ("compiler", compiler), ("torch", torch_v),
            ("Python", str(v.get("python_version") or "not in the trace")),
            ("config", cfg), ("switches", " ".join(f"{k}={val}" for k, val in env.items()))]


def run_rows(col: Collector) -> list[tuple[str, str, bool]]:
    """The front page's first block, the run this report is about: (field, value, shown
    as code) for each fact the trace has."""
    return [(k, val, k in ("program", "switches", "working directory") and val != "not in the trace")
            for k, val in run_facts(col) if val]


def about(col: Collector, opts: Options, inputs: list) -> list[tuple[str, str]]:
    """The report's self-description, as (field, value) pairs."""
    v = col.versions
    rows = [("tlparse version", f"tlparse {__version__} (this project's, Python {platform.python_version()})"),
            ("command", opts.command or " ".join(sys.argv)),
            ("inputs", "\n".join(f"{p} ({size:,} bytes)" for p, size in inputs)),
            ("records", f"{col.records:,} ({col.unparsed_count} unparsed)"),
            ("torch version", str(v.get("pytorch_version") or v.get("torch_version") or "not in the trace")),
            ("torch commit", str(v.get("commit") or "")),
            ("python version (traced program)", str(v.get("python_version") or "not in the trace")),
            ("compiler", str(v.get("engine") or ("torch.compile" if v.get("pytorch_version") else "unknown"))),
            ("traced program", " ".join(map(str, v.get("argv") or [])) if isinstance(v.get("argv"), list) else ""),
            ("ranks in envelopes", ", ".join(map(str, sorted(col.ranks_seen, key=str)))),
            ("event kinds", ", ".join(f"{k}: {n}{' (unknown, shown generically)' if k in col.unknown else ''}"
                                      for k, n in sorted(col.counts.items())))]
    return [(k, val) for k, val in rows if val]


def write_search_page(out: str, search: SearchWriter) -> None:
    html = render("search.html", title="Search", search=False,
                  config={"shards": search.shards, "truncated": search.truncated})
    with open(os.path.join(out, "search.html"), "w", encoding="utf-8") as f:
        f.write(html)


def write_directory(col: Collector, out: str, plain: bool) -> None:
    """compile_directory.json: every compile, its outcome and artifact files, for scripts."""
    entries = []
    for c in sorted(col.compiles.values(), key=_sort_key):
        entry = {"status": c.status(), "frame": frame_name(c), "where": frame_where(c),
                 "page": f"compiles/{c.slug}.{'txt' if plain else 'html'}",
                 "artifacts": [{"name": a.name, "attempt": a.attempt, "url": a.url, "bytes": a.size}
                               for a in c.artifacts]}
        entries.append(f"{json.dumps(c.label)}: {json.dumps(entry)}")   # C encoder: no indent
    with open(os.path.join(out, "compile_directory.json"), "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(entries) + "\n}\n")
