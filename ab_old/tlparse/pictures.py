"""The report's pictures, laid out here and drawn as inline SVG by templates
(graph_picture.html, time_chart.html): nothing to fetch, the report stays one folder.

- the captured graph of a compile, in layers (inputs on top, each node one layer below
  its lowest input), nodes coloured by the kernel they were fused into when the trace
  has the compiler's `kernel_provenance`, and a cut below it when the graph ended at a
  graph break;
- compile time per frame, one bar a frame, split by stage."""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

MAX_NODES = 300                 # larger graphs are not drawn (the page says so)
NODE_H, LAYER_GAP, NODE_GAP, CHAR_W = 22, 26, 12, 7.0
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f",
           "#e15759", "#bab0ac"]
GRAPH_ARTIFACTS = frozenset({"dynamo_output_graph"})

_SIGNATURE = re.compile(r"^\s*def forward\(self,?(.*)\):\s*$")
_PARAM = re.compile(r"(\w+)\s*(?::\s*\"[^\"]*\")?")
_ASSIGN = re.compile(r"^\s+(\w+)\s*(?::\s*\"[^\"]*\")?\s*=\s*(.+?)\s*$")
_FREE = re.compile(r";\s+(?:\w+\s*=\s*)+None$")
_NAME = re.compile(r"[A-Za-z_]\w*")
_STRING = re.compile(r"\"[^\"]*\"|'[^']*'")


@dataclasses.dataclass
class GraphShape:
    """A graph as the trace prints it: node names, their code and inputs, in order."""

    names: list          # [str]
    code: list           # [str] the right-hand side (or "input" / "return")
    inputs: list         # [[index of an input node]]
    too_big: int = 0     # node count when over MAX_NODES (nothing else kept)


def parse_graph(text: str) -> Optional[GraphShape]:
    """An FX GraphModule's printed code -> its nodes and edges; None when it is not one."""
    index: dict = {}
    alias: dict = {}
    g = GraphShape([], [], [])
    seen_forward = False
    for line in text.splitlines():
        m = _SIGNATURE.match(line)
        if m and not seen_forward:
            seen_forward = True
            for p in _PARAM.finditer(m.group(1)):
                name = p.group(1)
                index[name] = len(g.names)
                g.names.append(name), g.code.append("input"), g.inputs.append([])
            continue
        if not seen_forward or line.lstrip().startswith("#"):
            continue
        stripped = line.strip()
        if stripped.startswith("return"):
            body = _STRING.sub("", stripped[len("return"):])
            ins = sorted({index[n] for n in _NAME.findall(body) if n in index})
            g.names.append("output"), g.code.append(stripped), g.inputs.append(ins)
            break
        m = _ASSIGN.match(line)
        if not m:
            continue
        name, rhs = m.group(1), _FREE.sub("", m.group(2))
        if rhs in index:                 # `l_x_ = L_x_`: a new name, not a new node
            index[name] = index[rhs]
            alias[name] = rhs
            continue
        ins = sorted({index[n] for n in _NAME.findall(_STRING.sub("", rhs)) if n in index})
        index[name] = len(g.names)
        g.names.append(name), g.code.append(rhs), g.inputs.append(ins)
        if len(g.names) > MAX_NODES:
            return GraphShape([], [], [], too_big=sum(1 for ln in text.splitlines() if _ASSIGN.match(ln)))
    return g if g.names else None


@dataclasses.dataclass
class Box:
    """One node, its coordinates already printed (a big graph has thousands of numbers)."""

    name: str
    label: str           # the name, cut to fit the box
    code: str
    x: str
    y: str
    w: str
    cx: str              # the label's anchor
    ty: str
    color: str
    kernel: str


@dataclasses.dataclass
class GraphPicture:
    width: float
    height: float
    boxes: list          # [Box]
    edges: list          # [SVG path of an edge]
    kernels: list        # [(kernel name, color)] legend
    cut: Optional[str]   # the graph break the graph ended at
    cut_y: float = 0.0
    too_big: int = 0
    node_h: int = NODE_H


def layout_graph(g: GraphShape, kernel_of: Optional[dict] = None, cut: Optional[str] = None) -> GraphPicture:
    """Layers by longest path from the inputs; within a layer, nodes sit near the mean
    position of their inputs (one barycentre pass keeps most edges short and uncrossed)."""
    if g.too_big:
        return GraphPicture(0, 0, [], [], [], cut, too_big=g.too_big)
    kernel_of = kernel_of or {}
    n = len(g.names)
    layer = [0] * n
    for i in range(n):
        if g.inputs[i]:
            layer[i] = 1 + max(layer[j] for j in g.inputs[i])
    if g.names and g.names[-1] == "output":
        layer[-1] = max(layer) if n > 1 and max(layer[:-1]) < layer[-1] else max(layer[:-1], default=0) + 1
    layers: dict = {}
    for i in range(n):
        layers.setdefault(layer[i], []).append(i)
    widths = [min(max(len(g.names[i]), 4), 28) * CHAR_W + 16 for i in range(n)]
    x = [0.0] * n
    for depth in sorted(layers):
        row = layers[depth]
        if depth:
            row.sort(key=lambda i: sum(x[j] for j in g.inputs[i]) / len(g.inputs[i]) if g.inputs[i] else 0.0)
        pos = 10.0
        for i in row:
            x[i] = pos + widths[i] / 2
            pos += widths[i] + NODE_GAP
    width = max((x[i] + widths[i] / 2 for i in range(n)), default=0) + 10
    colors: dict = {}
    boxes = []
    y = [0] * n
    for i in range(n):
        kernel = kernel_of.get(g.names[i], "")
        if kernel and kernel not in colors:
            colors[kernel] = PALETTE[len(colors) % len(PALETTE)]
        color = colors.get(kernel, "#ffffff" if g.code[i] not in ("input",) else "#eef1f4")
        y[i] = 10 + layer[i] * (NODE_H + LAYER_GAP)
        name = g.names[i]
        boxes.append(Box(name, name if len(name) <= 28 else name[:27] + "…", g.code[i], f"{x[i] - widths[i] / 2:.1f}",
                         f"{y[i]}", f"{widths[i]:.1f}", f"{x[i]:.1f}", f"{y[i] + 15}", color, kernel))
    edges = []
    for i in range(n):
        for j in g.inputs[i]:
            y1, y2 = y[j] + NODE_H, y[i]
            mid = (y1 + y2) / 2
            edges.append(f"M{x[j]:.1f},{y1} C{x[j]:.1f},{mid:.1f} {x[i]:.1f},{mid:.1f} {x[i]:.1f},{y2}")
    height = max(y, default=0) + NODE_H + 10
    cut_y = height
    if cut:
        height += 30
    if cut:
        cut = cut if len(cut) <= 100 else cut[:99] + "…"
        width = max(width, (len(cut) + 16) * CHAR_W + 16)     # room for "✂ graph break: <reason>"
    return GraphPicture(round(width, 1), height, boxes, edges, list(colors.items()), cut, cut_y)


@dataclasses.dataclass
class Bar:
    label: str
    href: str
    total_s: float
    segments: list       # [(stage, seconds, x, width, color)]
    y: float


@dataclasses.dataclass
class TimeChart:
    width: float
    height: float
    bars: list           # [Bar]
    stages: list         # [(stage, color)] legend
    label_w: float
    hidden: int          # frames beyond the ones drawn
    max_s: float


MAX_BARS = 40


def _split_level(compiles: list, stage_depth: dict) -> int:
    """The nesting level the bars are split at: one below `entire_frame_compile` (what the
    compile time is; ours at level 0, PyTorch's inside `dynamo`), or else below the
    shallowest stage that spans the compiles' whole time."""
    if "entire_frame_compile" in stage_depth:
        return stage_depth["entire_frame_compile"] + 1
    total = sum(c.compile_time_s() or 0.0 for c in compiles)
    spans: dict = {}
    for c in compiles:
        for k, us in c.stages.items():
            spans[k] = spans.get(k, 0.0) + us / 1e6
    covering = [stage_depth.get(k, 0) for k, t in spans.items() if total and t >= 0.95 * total]
    return min(covering, default=0) + 1


def time_chart(compiles: list, stage_depth: Optional[dict] = None) -> Optional[TimeChart]:
    """One bar per frame (its compiles summed), longest first, split into the stages one
    level below the outermost (what is left of the outermost is `other`)."""
    stage_depth = stage_depth or {}
    level = _split_level(compiles, stage_depth)
    frames: dict = {}
    for c in compiles:
        t = c.compile_time_s()
        if not t:
            continue
        f = frames.setdefault((c.key[0], c.key[1]), {"compiles": [], "total": 0.0, "stages": {}})
        f["compiles"].append(c)
        f["total"] += t
        inner = {k: us / 1e6 for k, us in c.stages.items() if stage_depth.get(k, level) == level}
        inner_sum = sum(inner.values())
        if inner_sum > t:                    # stages that overlap: scale to the compile's time
            inner = {k: v * t / inner_sum for k, v in inner.items()}
            inner_sum = t
        for k, v in inner.items():
            f["stages"][k] = f["stages"].get(k, 0.0) + v
        if t - inner_sum > 0:
            f["stages"]["other"] = f["stages"].get("other", 0.0) + t - inner_sum
    if not frames:
        return None
    ranked = sorted(frames.values(), key=lambda f: -f["total"])
    shown = ranked[:MAX_BARS]
    names = sorted({k for f in shown for k in f["stages"]}, key=lambda k: (k == "other", k))
    colors = {k: PALETTE[i % len(PALETTE)] if k != "other" else "#c9ced6" for i, k in enumerate(names)}
    labels = []
    for f in shown:
        c = f["compiles"][0]
        from .report import frame_name     # report imports this module
        labels.append(f"{c.label.split('/')[0].lstrip('[')} {frame_name(c)}"[:40])
    label_w = max(len(s) for s in labels) * CHAR_W + 10
    plot_w = 560.0
    max_s = ranked[0]["total"]
    bars = []
    for i, (f, label) in enumerate(zip(shown, labels)):
        x = label_w
        segs = []
        for k in names:
            v = f["stages"].get(k, 0.0)
            if v <= 0:
                continue
            w = v / max_s * plot_w
            segs.append((k, v, x, w, colors[k]))
            x += w
        bars.append(Bar(label, f"compiles/{f['compiles'][0].slug}.html", f["total"], segs, 8 + i * 20))
    height = 8 + len(bars) * 20 + 8
    return TimeChart(label_w + plot_w + 90, height, bars, list(colors.items()), label_w,
                     len(ranked) - len(shown), max_s)
