"""`--all-ranks-html`: one report over every rank's log, pointing at the ranks that
compiled different graphs or recompiled differently.

Each rank gets its full report under rank_<N>/ (rendered one after the other, so memory
stays that of one rank); the front page compares small per-rank summaries."""

from __future__ import annotations

import dataclasses
import difflib
import html
import json
import os
import re
from typing import Optional

from .html_util import esc, page, table
from .report import Options, frame_name, real_compiles, render_log, write_assets

_RANK = re.compile(r"_rank_(\d+)_")


@dataclasses.dataclass
class RankSummary:
    rank: int
    path: str
    dir: str
    graphs: dict          # compile label -> md5 of its dynamo_output_graph (or None)
    graph_files: dict     # compile label -> path of its graph artifact
    frames: dict          # frame label ("0 fn") -> [compile labels]
    reasons: dict         # compile label -> ["guard", ...]
    statuses: dict        # compile label -> status
    pages: dict           # compile label -> its page, relative to the rank's report
    breaks: set
    unparsed: int
    timeline_events: int


def rank_of(path: str) -> Optional[int]:
    """From the file name (`..._rank_3_...`) or else the first envelope carrying "rank"."""
    m = _RANK.search(os.path.basename(path))
    if m:
        return int(m.group(1))
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    m = re.search(rb'"rank": ?(\d+)', head)
    return int(m.group(1)) if m else None


def summarize(col, rank: int, path: str, sub: str) -> RankSummary:
    comps = real_compiles(col)
    frames: dict = {}
    for c in comps:
        frames.setdefault(f"frame {c.key[1]} ({frame_name(c)})", []).append(c.label)
    return RankSummary(
        rank=rank, path=path, dir=sub,
        graphs={c.label: c.graph_md5 for c in comps},
        graph_files={c.label: os.path.join(col.root, c.graph_url) for c in comps if c.graph_url},
        frames=frames,
        reasons={c.label: [r.guard for r in c.recompile] for c in comps if c.recompile},
        statuses={c.label: c.status() for c in comps},
        pages={c.label: f"compiles/{c.slug}.{'txt' if col.plain else 'html'}" for c in comps},
        breaks={f"{g.info.reason} at {g.info.user_file}:{g.info.user_line}" for g in col.breaks.values()},
        unparsed=col.unparsed_count, timeline_events=col.timeline_count)


@dataclasses.dataclass
class Divergence:
    kind: str       # "compile ids", "graph", "recompiles", "graph breaks"
    what: str
    detail: str


def compare(ranks: list[RankSummary]) -> list[Divergence]:
    out: list[Divergence] = []
    names = [r.rank for r in ranks]
    all_labels = sorted({label for r in ranks for label in r.graphs}, key=_label_order)
    for label in all_labels:
        have = [r.rank for r in ranks if label in r.graphs]
        if len(have) != len(ranks):
            lack = [n for n in names if n not in have]
            out.append(Divergence("compile ids", label, f"compiled by rank(s) {_list(have)}, not by {_list(lack)}"))
            continue
        md5s: dict = {}
        for r in ranks:
            md5s.setdefault(r.graphs[label], []).append(r.rank)
        if len(md5s) > 1:
            groups = "; ".join(f"rank(s) {_list(v)}: graph {(k or 'none')[:8]}" for k, v in md5s.items())
            firsts = [next(r for r in ranks if r.rank == v[0]) for v in md5s.values()][:2]
            out.append(Divergence("graph", label, f"different graphs captured: {groups}\n"
                                  + graph_diff(firsts[0], firsts[1], label)))
    all_frames = sorted({f for r in ranks for f in r.frames}, key=_label_order)
    for frame in all_frames:
        counts = {r.rank: len(r.frames.get(frame, [])) for r in ranks}
        if len(set(counts.values())) > 1:
            detail = ", ".join(f"rank {k}: {v} compile(s)" for k, v in counts.items())
            why = []
            for r in ranks:
                for label in r.frames.get(frame, []):
                    for g in r.reasons.get(label, []):
                        why.append(f"rank {r.rank} {label}: {g}")
            out.append(Divergence("recompiles", frame, detail + ("\n" + "\n".join(why) if why else "")))
    all_breaks = set().union(*(r.breaks for r in ranks)) if ranks else set()
    for b in sorted(all_breaks):
        have = [r.rank for r in ranks if b in r.breaks]
        if len(have) != len(ranks):
            out.append(Divergence("graph breaks", b, f"only on rank(s) {_list(have)}"))
    return out


def _graph_text(path: Optional[str]) -> list[str]:
    """The graph as written in a rank's report (HTML page or plain text file)."""
    if not path or not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if path.endswith(".html"):
        m = re.search(r"<pre[^>]*>(.*?)</pre>", text, re.S)
        text = html.unescape(m.group(1)) if m else ""
    return text.splitlines()


def graph_diff(a: RankSummary, b: RankSummary, label: str, limit: int = 24) -> str:
    lines = list(difflib.unified_diff(_graph_text(a.graph_files.get(label)), _graph_text(b.graph_files.get(label)),
                                      f"rank {a.rank}", f"rank {b.rank}", n=0, lineterm=""))
    if len(lines) > limit:
        lines = lines[:limit] + [f"... {len(lines) - limit} more diff lines"]
    return "\n".join(lines)


def _list(xs) -> str:
    return ", ".join(map(str, xs))


def _label_order(label: str):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", label)]


def render_ranks(paths: list[str], out: str, opts: Options) -> list[RankSummary]:
    found = [(rank_of(p), p) for p in paths]
    numbered = []
    used = set()
    for i, (r, p) in enumerate(sorted(found, key=lambda x: (x[0] is None, x[0] or 0, x[1]))):
        if r is None or r in used:   # no rank anywhere: number the files
            r = max(used, default=-1) + 1
        used.add(r)
        numbered.append((r, p))
    summaries = []
    for r, p in numbered:
        sub = os.path.join(out, f"rank_{r}")
        col = render_log([p], sub, opts, rank=r)
        summaries.append(summarize(col, r, p, f"rank_{r}"))
        del col
    divergences = compare(summaries)
    _combined_timeline(out, summaries)
    if opts.plain:
        _write_text(out, summaries, divergences)
    else:
        write_assets(out)
        _write_html(out, summaries, divergences)
    return summaries


def _combined_timeline(out: str, ranks: list[RankSummary]) -> None:
    """Every rank's chromium events in one file, pid = rank (Perfetto shows a row per rank)."""
    first = True
    with open(os.path.join(out, "chromium_events.json"), "wb") as dst:
        dst.write(b"[\n")
        for r in ranks:
            if not r.timeline_events:
                continue
            path = os.path.join(out, r.dir, "chromium_events.json")
            size = os.path.getsize(path)
            with open(path, "rb") as src:
                src.seek(2)                   # past "[\n"
                left = size - 2 - 3           # up to "\n]\n"
                if not first:
                    dst.write(b",\n")
                first = False
                while left > 0:
                    data = src.read(min(left, 8 << 20))
                    if not data:
                        break
                    dst.write(data)
                    left -= len(data)
        dst.write(b"\n]\n")


def _write_html(out: str, ranks: list[RankSummary], divs: list[Divergence]) -> None:
    p = ["<h1>All ranks</h1>"]
    if divs:
        kinds = sorted({d.kind for d in divs})
        p.append(f'<div class="warn"><b>Ranks diverge</b> ({esc(", ".join(kinds))}). Ranks that compile different '
                 "graphs or recompile differently can hang or time out in collectives.</div>")
        p.append("<h2>What differs between ranks</h2>")
        p.append(table(["kind", "what", "detail"],
                       [[esc(d.kind), f"<code>{esc(d.what)}</code>", f'<pre class="wrap">{esc(d.detail)}</pre>']
                        for d in divs]))
    else:
        p.append("<p>All ranks compiled the same compile ids with the same graphs and recompiled alike.</p>")
    rows = []
    for r in ranks:
        st: dict = {}
        for s in r.statuses.values():
            st[s] = st.get(s, 0) + 1
        links = " ".join(f'<a class="cid status-{esc(s)}" href="{esc(r.dir)}/{esc(r.pages[label])}">{esc(label)}</a>'
                         for label, s in r.statuses.items())
        rows.append([f'<a href="{esc(r.dir)}/index.html">rank {r.rank}</a>', f'<span class="mono">{esc(r.path)}</span>',
                     str(len(r.graphs)), links, str(len(r.breaks)), str(r.unparsed)])
    p.append("<h2>Ranks</h2>" + table(["rank", "log", "compiles", "compile ids", "distinct graph breaks",
                                        "unparsed lines"], rows, {2, 4, 5}))
    p.append('<p>Timeline of every rank: <a href="chromium_events.json">chromium_events.json</a> '
             "(open in ui.perfetto.dev or chrome://tracing; one process row per rank).</p>")
    with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as f:
        f.write(page("All ranks", "\n".join(p), search=False, nav=False))
    with open(os.path.join(out, "ranks.json"), "w", encoding="utf-8") as f:
        json.dump({"ranks": [{"rank": r.rank, "log": r.path, "report": f"{r.dir}/index.html",
                              "compiles": r.statuses} for r in ranks],
                   "divergences": [dataclasses.asdict(d) for d in divs]}, f, indent=1)


def _write_text(out: str, ranks: list[RankSummary], divs: list[Divergence]) -> None:
    lines = ["All ranks", ""]
    for r in ranks:
        lines.append(f"rank {r.rank}: {os.path.basename(r.path)}: {len(r.graphs)} compiles "
                     f"({' '.join(r.statuses)}) -> {r.dir}/index.txt")
    lines += ["", "Divergences:" if divs else "No divergence between ranks."]
    for d in divs:
        lines.append(f"- {d.kind}: {d.what}: {d.detail}")
    with open(os.path.join(out, "index.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
