"""Build a report: stream each log through a Collector, then write the front page, one
page per compile, the search page and the machine-readable exports."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from typing import Optional

from . import __version__, assets, stacktrie
from .collect import Collector, SearchWriter
from .html_util import code_block, esc, fmt_seconds, page, table
from .interpret import base_entry, resume_target
from .model import Compile

SLOWEST = 15


@dataclasses.dataclass
class Options:
    plain: bool = False
    command: str = ""


def render_log(paths: list[str], out: str, opts: Options, rank: Optional[int] = None) -> Collector:
    """One report (one process or rank) from one or more log files, into `out`."""
    os.makedirs(out, exist_ok=True)
    for sub in ("compiles", "artifacts"):  # artifacts/ is flat: <compile>-<n>_<name>
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
    inputs = [(p, os.path.getsize(p)) for p in paths]
    if opts.plain:
        from . import plaintext
        plaintext.write(col, out, opts, inputs)
    else:
        _index_search(col)
        col.search.flush()
        write_compile_pages(col, out)
        write_index(col, out, opts, inputs, rank)
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


def link(c: Compile, depth: int = 0) -> str:
    up = "../" * depth
    return f'<a class="cid status-{c.status()}" href="{up}compiles/{c.slug}.html">{esc(c.label)}</a>'


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


def _index_search(col: Collector) -> None:
    s = col.search
    for c in real_compiles(col):
        s.add("frame", f"{c.label} {frame_name(c)}", f"compiles/{c.slug}.html",
              " \n".join([frame_where(c)] + [f"{fr} {loc}" for fr, loc in c.stack]))
        for r in c.recompile:
            s.add("recompile", f"{c.label} {frame_name(c)}: {r.guard}", f"compiles/{c.slug}.html",
                  f"{r.guard}\n{r.user_line or ''}\n{r.user_code}")
        if c.fail_type:
            s.add("failure", f"{c.label} {c.fail_type}", f"compiles/{c.slug}.html", c.fail_reason or "")
    for i, g in enumerate(col.ranked_breaks()):
        info = g.info
        s.add("graph break", f"{info.reason} at {info.user_file}:{info.user_line}", f"index.html#break-{i}",
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


def _quick_links(c: Compile) -> str:
    first: dict = {}
    for a in c.artifacts:
        kind = _QUICK_CACHE.get(a.name, 0)
        if kind == 0:
            kind = _QUICK_CACHE[a.name] = _quick_kind(a.name)
        if kind is not None and kind not in first:
            first[kind] = a
    items = [f'<a href="../{esc(first[label].url)}">{esc(label)}</a>' if label in first
             else f'<span class="muted">{esc(label)}</span>' for label, _ in QUICK]
    if c.metrics_text:
        items.append('<a href="#compilation_metrics">metrics</a>')
    return " · ".join(items)


METRIC_KEYS = ["entire_frame_compile_time_s", "backend_compile_time_s", "inductor_compile_time_s",
               "code_gen_time_s", "dynamo_time_before_restart_s", "guard_count", "shape_env_guard_count",
               "graph_op_count", "graph_node_count", "graph_input_count", "cache_size", "accumulated_cache_size",
               "has_guarded_code", "fail_type"]


def write_compile_pages(col: Collector, out: str) -> None:
    frames = frames_of(col)
    break_ids = {id(g): i for i, g in enumerate(col.ranked_breaks())}
    groups = {k: g for k, g in col.breaks.items()}
    for c in col.compiles.values():
        siblings = frames.get((c.key[0], c.key[1]), [])
        parts = [f'<h1>{esc(c.label)} {esc(frame_name(c))} <span class="pill status-{c.status()}">'
                 f'{esc(c.status())}</span></h1>']
        if c.key == (None, None, None):
            parts[0] = "<h1>Events outside any compile [-/-]</h1>"
        where = frame_where(c)
        if where:
            parts.append(f'<p class="mono">{esc(where)}'
                         + (' <span class="tag">resumed after a graph break</span>' if resume_target(c.co_name) else "")
                         + "</p>")
        if len(siblings) > 1:
            parts.append("<p>Compiles of this frame: " + " ".join(
                (f"<b>{esc(s.label)}</b>" if s is c else link(s, 1)) for s in siblings) + "</p>")
        parts.append(f"<p>{_quick_links(c)}</p>" if c.key != (None, None, None) else "")
        if c.stack:
            parts.append("<h2>Stack</h2>" + code_block("\n".join(
                f"{fr}\n    {loc}" if loc else fr for fr, loc in c.stack), "text"))
        if c.recompile:
            parts.append("<h2>Why it recompiled</h2>" + table(
                ["cache entry", "failing guard", "expected", "actual", "user line"],
                [[esc(r.entry), f"<code>{esc(r.guard)}</code>", esc(r.expected or ""), esc(r.actual or ""),
                  esc(r.user_line or "") + (f"<br><code>{esc(r.user_code)}</code>" if r.user_code else "")
                  + (f'<br><span class="muted">{esc(r.note)}</span>' if r.note else "")] for r in c.recompile]))
        if c.breaks:
            items = []
            for gk in c.breaks:
                g = groups[gk]
                items.append(f'<li><a href="../index.html#break-{break_ids[id(g)]}">{esc(g.info.reason)}</a> at '
                             f'<span class="mono">{esc(g.info.user_file)}:{esc(g.info.user_line)}</span></li>')
            parts.append("<h2>Graph breaks</h2><ul>" + "".join(items) + "</ul>")
        if c.fail_type or c.restart_reasons:
            parts.append("<h2>Failure and restarts</h2>")
            if c.fail_type:
                parts.append(f"<p><b>{esc(c.fail_type)}</b> {esc(c.fail_where or '')}</p>"
                             + code_block(c.fail_reason or "", "text", wrap=True))
                for url in c.error_artifacts:
                    parts.append(f'<p><a href="../{esc(url)}">traceback</a></p>')
            for r in c.restart_reasons:
                parts.append("<p>restart:</p>" + code_block(r, "text", wrap=True))
        if c.artifacts:
            rows = []
            for a in c.artifacts:
                rows.append([esc(c.label[:-1] + (f"_{a.attempt}]" if a.attempt else "]")),
                             f'<a href="../{esc(a.url)}">{esc(a.name)}</a>', f"{a.size:,}", str(a.lineno)])
            parts.append("<h2>Artifacts</h2>" + table(["attempt", "artifact", "bytes", "trace line"], rows, {2, 3}))
        if c.metrics_text:
            rows = [[esc(k), esc(_fmt_metric(c.metrics.get(k)))] for k in METRIC_KEYS if k in c.metrics]
            parts.append('<h2 id="compilation_metrics">Compilation metrics</h2>' + table(["metric", "value"], rows, {1})
                         + "<details><summary>all fields</summary>"
                         + code_block(col.unspill(c.metrics_text), "json", wrap=True) + "</details>")
        if c.bwd_metrics_text:
            parts.append('<h2 id="bwd_compilation_metrics">Backward compilation metrics</h2>'
                         + code_block(col.unspill(c.bwd_metrics_text), "json", wrap=True))
        if c.stages:
            total = c.top_us or None
            rows = [[esc(k), fmt_seconds(v / 1e6), f"{100 * v / total:.0f}%" if total else ""]
                    for k, v in sorted(c.stages.items(), key=lambda kv: -kv[1])]
            parts.append("<h2>Time per stage</h2>" + table(["stage", "time", "of compile"], rows, {1, 2}))
        if c.events:
            rows = [[str(a), esc(n), str(ln), f"<code>{esc(col.unspill(ref))}</code>"] for a, n, ln, ref in c.events]
            note = f"<p class=muted>{c.events_dropped} more in raw.jsonl</p>" if c.events_dropped else ""
            parts.append(f"<h2>Other events</h2><details><summary>{len(c.events)} events</summary>"
                         + table(["attempt", "event", "trace line", "data"], rows) + note + "</details>")
        col.files.submit(os.path.join(out, "compiles", f"{c.slug}.html"),
                         page(f"{c.label} {frame_name(c)}", "\n".join(parts), depth=1))


def _fmt_metric(v) -> str:
    if isinstance(v, float):
        return f"{v:.6f}".rstrip("0").rstrip(".")
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return "" if v is None else str(v)


# ---- front page
def write_index(col: Collector, out: str, opts: Options, inputs: list, rank: Optional[int]) -> None:
    comps = real_compiles(col)
    frames = frames_of(col)
    fails = failures(col)
    breaks = col.ranked_breaks()
    recompiled = {k: v for k, v in frames.items() if len(v) > 1}
    total_time = sum(c.compile_time_s() or 0 for c in comps)
    n_fail = sum(1 for c in comps if c.fail_type)
    n_restart = sum(len(c.restart_reasons) for c in comps)
    title = "Compile report" + (f" — rank {rank}" if rank is not None else "")
    p = [f"<h1>{esc(title)}</h1>", run_html(col)]
    if rank is not None:
        p.append('<p><a href="../index.html">all ranks</a>: how this rank differs from the others</p>')
    cards = [("compiles", len(comps), False), ("frames", len(frames), False),
             ("distinct graph breaks", len(breaks), bool(breaks)),
             ("recompiles", sum(len(v) - 1 for v in recompiled.values()), bool(recompiled)),
             ("failures", n_fail, bool(n_fail)), ("restarts", n_restart, bool(n_restart)),
             ("compile time", fmt_seconds(total_time) or "0", False),
             ("unparsed lines", col.unparsed_count, bool(col.unparsed_count))]
    p.append('<div class="cards">' + "".join(
        f'<div class="card{" bad" if bad else ""}"><b>{esc(v)}</b>{esc(k)}</div>' for k, v, bad in cards) + "</div>")
    if col.unparsed_count:
        p.append(f'<div class="warn">{col.unparsed_count} line(s) could not be parsed; '
                 f'<a href="#unparsed">see where</a>.</div>')
    if col.md5_mismatch_count:
        p.append(f'<div class="warn">{col.md5_mismatch_count} payload(s) do not match their has_payload md5 '
                 f'(truncated or edited?): trace lines {", ".join(map(str, col.md5_mismatch[:20]))}.</div>')

    # graph breaks
    p.append('<h2 id="breaks">Graph breaks, costliest first</h2>')
    if breaks:
        p.append('<p class="muted">Deduplicated by user line and reason. <i>Frames</i>: compiles that broke there '
                 'plus resume functions compiled after it; <i>time</i>: compile time of those resume functions and '
                 'of restarts.</p>')
        rows = []
        for i, g in enumerate(breaks):
            info = g.info
            hints = "".join(f"<li>{esc(h)}</li>" for h in info.hints)
            detail = (f'<b id="break-{i}">{esc(info.reason)}</b>'
                      + (f'<br><span class="muted">{esc(info.explanation)}</span>' if info.explanation else "")
                      + (f"<ul class=small>{hints}</ul>" if hints else ""))
            where = (f'<span class="mono">{esc(info.user_file)}:{esc(info.user_line)}</span>'
                     + (f"<br><code>{esc(info.user_code)}</code>" if info.user_code else ""))
            occ = " ".join(link(col.compiles[k]) for k in g.compiles if k in col.compiles)
            res = " ".join(link(col.compiles[k]) for k in g.resume_compiles if k in col.compiles)
            rows.append([str(i + 1), detail, where, occ + (f"<br>resumed: {res}" if res else ""),
                         str(g.frames_caused), fmt_seconds(g.time_caused_s)])
        p.append(table(["#", "reason and hints", "user line", "compiles", "frames", "time"], rows, {4, 5}))
    else:
        p.append("<p>No graph breaks.</p>")

    # recompiles
    p.append('<h2 id="recompiles">Recompiles</h2>')
    if recompiled:
        for (caid, fid), cs in recompiled.items():
            first = cs[0]
            p.append(f"<h3>{esc(frame_name(first))} <span class=muted>{esc(frame_where(first))}</span> — "
                     f"{len(cs)} compiles</h3>")
            rows = []
            for c in cs[1:]:
                prev = cs[cs.index(c) - 1].label.strip("[]")
                rs = [r for r in c.recompile if not r.entry or base_entry(r.entry) == prev] or c.recompile
                if not rs:
                    rows.append([link(c), '<span class="muted">no reason in the trace</span>', "", "", ""])
                elif len(rs) < len(c.recompile):
                    rows.append(["", f'<span class="muted">+ {len(c.recompile) - len(rs)} older cache entries '
                                 f'failed too (<a href="compiles/{c.slug}.html">all</a>)</span>', "", "", ""])
                for r in rs:
                    rows.append([link(c), f"<code>{esc(r.guard)}</code>" + (f' <span class="muted">(entry {esc(r.entry)})</span>' if r.entry else ""),
                                 esc(r.expected or ""), esc(r.actual or ""),
                                 esc(r.user_line or "") + (f"<br><code>{esc(r.user_code)}</code>" if r.user_code else "")
                                 + (f'<br><span class="muted">{esc(r.note)}</span>' if r.note else "")])
            p.append(table(["compile", "failing guard", "expected", "actual", "user line"], rows))
    else:
        p.append("<p>No frame was compiled more than once.</p>")

    # failures and restarts
    p.append('<h2 id="failures">Failures and restarts</h2>')
    if fails:
        rows = [[link(c), esc(kind), code_block(reason, "text", wrap=True), esc(where)] for c, kind, reason, where in fails]
        p.append(table(["compile", "kind", "reason", "user frame"], rows))
    else:
        p.append("<p>No compile failed or restarted.</p>")

    # slowest
    p.append('<h2 id="slowest">Slowest compiles</h2>')
    timed = sorted((c for c in comps if c.compile_time_s()), key=lambda c: -(c.compile_time_s() or 0))[:SLOWEST]
    if timed:
        rows = []
        for c in timed:
            top = sorted(c.stages.items(), key=lambda kv: -kv[1])[1:4]
            rows.append([link(c), esc(frame_name(c)), fmt_seconds(c.compile_time_s()), esc(c.status()),
                         esc(", ".join(f"{k} {fmt_seconds(v / 1e6)}" for k, v in top))])
        p.append(table(["compile", "frame", "time", "outcome", "largest stages"], rows, {2}))
    else:
        p.append("<p>No compile times in the trace.</p>")

    # stack trie
    p.append('<h2 id="trie">Stack trie</h2><p class="legend">Each user stack that triggered a compile; '
             'click a compile id for its page. <span class="status-ok">success</span>'
             '<span class="status-resumed">resumed: a frame reached through a graph break</span>'
             '<span class="status-error">failure</span><span class="status-restart">restart</span>'
             '<span class="status-empty">empty graph</span><span class="status-missing">no metrics</span> '
             'Hover a compile id for its outcome; compiles that graph-broke are listed under '
             '<a href="#breaks">graph breaks</a>.</p>')
    p.append(stacktrie.render_html(stacktrie.build(comps), lambda c: f"compiles/{c.slug}.html"))

    # all compiles
    p.append('<h2 id="compiles">All compiles</h2><details><summary>' + str(len(comps)) + " compiles</summary>")
    p.append(table(["compile", "frame", "where", "outcome", "time", "artifacts"],
                   [[link(c), esc(frame_name(c)), f'<span class="mono">{esc(frame_where(c))}</span>', esc(c.status()),
                     fmt_seconds(c.compile_time_s()), str(len(c.artifacts))] for c in comps], {4, 5}) + "</details>")
    glob = col.compiles.get((None, None, None))
    if glob is not None and glob.artifacts:
        p.append('<p>Events outside any compile: <a href="compiles/global.html">[-/-]</a></p>')

    # unparsed
    p.append(f'<h2 id="unparsed">Unparsed lines: {col.unparsed_count}</h2>')
    if col.unparsed:
        rows = [[str(u.lineno), esc(u.error), f"<code>{esc(u.text)}</code>"] for u in col.unparsed]
        more = (f"<p class=muted>first {len(col.unparsed)} of {col.unparsed_count} shown</p>"
                if col.unparsed_count > len(col.unparsed) else "")
        p.append(table(["line", "why", "text"], rows, {0}) + more)
    else:
        p.append("<p>Every line parsed.</p>")

    p.append(about_html(col, opts, inputs))
    with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as f:
        f.write(page(title, "\n".join(p)))


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


def run_html(col: Collector) -> str:
    """The front page's first block: the run this report is about."""
    rows = []
    for k, val in run_facts(col):
        if not val:
            continue
        literal = k in ("program", "switches", "working directory") and val != "not in the trace"
        cell = f"<code>{esc(val)}</code>" if literal else esc(val)
        if k == "config" and col.dynamo_configs:
            cell += " — " + " · ".join(f'<a href="{esc(url)}">{esc(label)}</a>' for label, url in col.dynamo_configs)
            knobs = config_knobs(col)
            if knobs:
                cell += ("<details><summary>knobs</summary>" + table(
                    ["knob", "value"], [[f"<code>{esc(n)}</code>", f"<code>{esc(json.dumps(x, default=str))}</code>"]
                                        for n, x in sorted(knobs.items())]) + "</details>")
        rows.append([esc(k), cell])
    return '<div id="run">' + table(["this run", ""], rows) + '</div>'


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


def about_html(col: Collector, opts: Options, inputs: list) -> str:
    rows = [[esc(k), f'<pre class="wrap">{esc(v)}</pre>' if "\n" in v or len(v) > 120 else esc(v)]
            for k, v in about(col, opts, inputs)]
    cfg = " · ".join(f'<a href="{esc(url)}">{esc(name)}</a>' for name, url in sorted(col.config.items()))
    rows.append(["compiler config", cfg or "not in the trace"])
    rows.append(["exports", '<a href="chromium_events.json">chromium_events.json</a> (compile timeline: open in '
                 'ui.perfetto.dev or chrome://tracing) · <a href="raw.jsonl">raw.jsonl</a> (every parsed event) · '
                 '<a href="compile_directory.json">compile_directory.json</a> (artifacts per compile)'])
    return '<h2 id="about">About this report</h2>' + table(["", ""], rows)


def write_search_page(out: str, search: SearchWriter) -> None:
    cfg = json.dumps({"shards": search.shards, "truncated": search.truncated})
    body = ('<h1>Search</h1><p>Frames, graph-break reasons, recompile reasons, failures and code '
            '(graphs, guards, bytecode, generated code).</p>'
            '<p><input id="q" type="search" autofocus placeholder="e.g. aten.addmm, size mismatch, f_print" '
            'style="width:480px;padding:6px"> <span id="status" class="muted"></span></p><ul id="results"></ul>'
            f"<script>window.TL_SEARCH_CONFIG = {cfg};</script>")
    with open(os.path.join(out, "search.html"), "w", encoding="utf-8") as f:
        f.write(page("Search", body, search=False))


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
