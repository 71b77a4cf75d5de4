"""`--all-ranks-html`: one report over every rank's log, pointing at the ranks that
compiled different graphs or recompiled differently.

Each rank gets its full report under rank_<N>/ (rendered one after the other, so memory
stays that of one rank); the front page compares small per-rank summaries."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import html
import json
import os
import re
from typing import Optional

from . import collectives
from .collect import mask_volatile
from .report import Options, frame_name, real_compiles, render_log, write_assets
from .templating import render

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
    guards: dict = dataclasses.field(default_factory=dict)        # compile label -> md5 of its guards
    guard_files: dict = dataclasses.field(default_factory=dict)   # compile label -> path of its guards artifact
    collectives: dict = dataclasses.field(default_factory=dict)   # compile label -> ["all_reduce (graph)", ...]


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
    guards, guard_files, comms = {}, {}, {}
    for c in comps:
        for a in c.artifacts:
            if a.name in ("dynamo_cpp_guards_str", "dynamo_guards"):
                # object addresses differ between processes: the hash is of the text without them
                guard_files[c.label] = os.path.join(col.root, a.url)
                guards[c.label] = hashlib.md5("\n".join(_masked_lines(guard_files[c.label])).encode()).hexdigest()
        ops = [f"{op} (in graph)" for op in collectives.in_graph(
            "\n".join(_graph_text(os.path.join(col.root, c.graph_url) if c.graph_url else None)))]
        for gk in c.breaks:
            group = col.breaks.get(gk)
            if group is not None:
                ops += [f"{op} (graph break)" for op in collectives.in_break(group.info.reason, group.info.user_code)]
        comms[c.label] = ops
    return RankSummary(
        rank=rank, path=path, dir=sub,
        graphs={c.label: c.graph_md5 for c in comps},
        graph_files={c.label: os.path.join(col.root, c.graph_url) for c in comps if c.graph_url},
        frames=frames,
        reasons={c.label: [r.guard for r in c.recompile] for c in comps if c.recompile},
        statuses={c.label: c.status() for c in comps},
        pages={c.label: f"compiles/{c.slug}.{'txt' if col.plain else 'html'}" for c in comps},
        breaks={f"{g.info.reason} at {g.info.user_file}:{g.info.user_line}" for g in col.breaks.values()},
        unparsed=col.unparsed_count, timeline_events=col.timeline_count,
        guards=guards, guard_files=guard_files, collectives=comms)


@dataclasses.dataclass
class Divergence:
    kind: str       # "compile ids", "graph", "guards", "collectives", "recompiles", "graph breaks"
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
        out.extend(_guard_divergence(ranks, label))
        out.extend(_collective_divergence(ranks, label))
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
    out.extend(_collective_order(ranks))
    all_breaks = set().union(*(r.breaks for r in ranks)) if ranks else set()
    for b in sorted(all_breaks):
        have = [r.rank for r in ranks if b in r.breaks]
        if len(have) != len(ranks):
            out.append(Divergence("graph breaks", b, f"only on rank(s) {_list(have)}"))
    return out


def _guard_divergence(ranks: list[RankSummary], label: str) -> list[Divergence]:
    """The same compile id guarded on different things (a rank-dependent value, a different
    shape): the ranks will recompile at different calls."""
    md5s: dict = {}
    for r in ranks:
        md5s.setdefault(r.guards.get(label), []).append(r.rank)
    if len(md5s) < 2:
        return []
    groups = "; ".join(f"rank(s) {_list(v)}: guards {(k or 'none')[:8]}" for k, v in md5s.items())
    firsts = [next(r for r in ranks if r.rank == v[0]) for v in md5s.values()][:2]
    return [Divergence("guards", label, f"different guards: {groups}\n"
                       + _text_diff(firsts[0], firsts[1], firsts[0].guard_files.get(label),
                                    firsts[1].guard_files.get(label)))]


def _collective_divergence(ranks: list[RankSummary], label: str) -> list[Divergence]:
    """The same compile id runs different collectives (in its graph or at its break)."""
    seqs: dict = {}
    for r in ranks:
        seqs.setdefault(tuple(r.collectives.get(label, [])), []).append(r.rank)
    if len(seqs) < 2:
        return []
    detail = "\n".join(f"rank(s) {_list(v)}: {', '.join(k) or 'no collective'}" for k, v in seqs.items())
    return [Divergence("collectives", label, detail)]


def _collective_order(ranks: list[RankSummary]) -> list[Divergence]:
    """Every rank's collectives over all its compiles, in compile order: where they first
    differ is where a real run would wait forever."""
    seqs = {r.rank: [f"{label} {op}" for label in sorted(r.collectives, key=_label_order)
                     for op in r.collectives[label]] for r in ranks}
    if len({tuple(v) for v in seqs.values()}) < 2:
        return []
    strip = {k: [x.split(" ", 1)[1] for x in v] for k, v in seqs.items()}
    if len({tuple(v) for v in strip.values()}) < 2:
        return []   # the same collectives in the same order, only in other compiles: reported per compile
    n = min(len(v) for v in strip.values())
    first = next((i for i in range(n) if len({v[i] for v in strip.values()}) > 1), n)
    detail = [f"first difference at collective #{first + 1}"]
    for k, v in seqs.items():
        shown = v[max(0, first - 1):first + 2]
        detail.append(f"rank {k}: {len(v)} collective(s); " + ("; ".join(shown) if shown else "none from there"))
    return [Divergence("collectives", "order over all compiles", "\n".join(detail))]


def _text_diff(a: RankSummary, b: RankSummary, path_a: Optional[str], path_b: Optional[str],
               limit: int = 24) -> str:
    lines = list(difflib.unified_diff(_masked_lines(path_a), _masked_lines(path_b), f"rank {a.rank}",
                                      f"rank {b.rank}", n=0, lineterm=""))
    if len(lines) > limit:
        lines = lines[:limit] + [f"... {len(lines) - limit} more diff lines"]
    return "\n".join(lines)


_TIMING_LINE = re.compile(r"^\s*Guard latency\b")   # PyTorch's guard dump ends with a measured time


def _masked_lines(path: Optional[str]) -> list[str]:
    """A guard or graph text without what differs between any two processes (addresses, timings)."""
    text = mask_volatile("\n".join(_graph_text(path)).encode("utf-8", "replace")).decode("utf-8", "replace")
    return [line for line in text.splitlines() if not _TIMING_LINE.match(line)]


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
    html = render("ranks.html", title="All ranks", search=False, nav=False, ranks=ranks, divs=divs,
                  kinds=sorted({d.kind for d in divs}), side=side_by_side(ranks), differ={d.what for d in divs})
    with open(os.path.join(out, "index.html"), "w", encoding="utf-8") as f:
        f.write(html)
    with open(os.path.join(out, "ranks.json"), "w", encoding="utf-8") as f:
        json.dump({"ranks": [{"rank": r.rank, "log": r.path, "report": f"{r.dir}/index.html",
                              "compiles": r.statuses, "guards": r.guards, "collectives": r.collectives}
                             for r in ranks],
                   "divergences": [dataclasses.asdict(d) for d in divs]}, f, indent=1)


def side_by_side(ranks: list[RankSummary]) -> list[tuple]:
    """[(compile label, [per rank: {status, graph, guards, collectives} or None])]."""
    labels = sorted({label for r in ranks for label in r.statuses}, key=_label_order)
    rows = []
    for label in labels:
        cells = []
        for r in ranks:
            if label not in r.statuses:
                cells.append(None)
                continue
            cells.append({"status": r.statuses[label], "graph": (r.graphs.get(label) or "")[:8],
                          "guards": (r.guards.get(label) or "")[:8],
                          "collectives": ", ".join(r.collectives.get(label, []))})
        rows.append((label, cells))
    return rows


def _write_text(out: str, ranks: list[RankSummary], divs: list[Divergence]) -> None:
    lines = ["All ranks", ""]
    for r in ranks:
        lines.append(f"rank {r.rank}: {os.path.basename(r.path)}: {len(r.graphs)} compiles "
                     f"({' '.join(r.statuses)}) -> {r.dir}/index.txt")
    lines += ["", "Compiles side by side:"]
    for label, cells in side_by_side(ranks):
        mark = "!" if label in {d.what for d in divs} else " "
        lines.append(f"{mark} {label:<10} " + " | ".join(
            f"rank {r.rank}: " + (" ".join(f"{k}={v}" for k, v in cell.items() if v) if cell else "not compiled")
            for r, cell in zip(ranks, cells)))
    lines += ["", "Divergences:" if divs else "No divergence between ranks."]
    for d in divs:
        lines.append(f"- {d.kind}: {d.what}: {d.detail}")
    with open(os.path.join(out, "index.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
