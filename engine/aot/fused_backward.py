"""A graph that runs its own backward (`loss.backward()` traced into it, capture/backward.py),
partitioned as a joint graph and put back together as one.

Traced with autograd on, the graph computes its forward, the loss's tangent (a node marked
by engine/backward_ops.py), the backward and whatever follows (gradient accumulation, an
optimizer's update): every forward value the backward reads stays alive from the forward to
its use, where a compiled backward recomputes the cheap ones (a GELU, a bf16 cast of a
weight) from fewer saved tensors. Here the traced graph is cut at the tangent into the
joint graph's form (the tangent a placeholder, the results before it forward outputs, the
rest gradients), the partitioner picks what to save, and the forward and backward graphs
it yields are joined again into one graph: the forward, the tangent, then the backward with
its recomputations. One graph is compiled and called, and its peak memory is the
partitioned pair's."""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx

from ..backward_ops import TANGENT_MARK
from .partition import joint_parts, split
from .trace import JointLayout, graph_module, output_nodes, placeholders


def tangent_node(gm: torch.fx.GraphModule) -> Optional[torch.fx.Node]:
    """The one node the mark is on, made from the loss (`ones_like(loss)`); None otherwise
    (a decomposition that makes it otherwise leaves the graph as traced)."""
    marked = [n for n in gm.graph.nodes if n.meta.get("custom") == TANGENT_MARK]
    if len(marked) != 1 or not marked[0].args or not isinstance(marked[0].args[0], torch.fx.Node):
        return None
    return marked[0]


def rematerialize(traced: torch.fx.GraphModule, free: set, saver) -> torch.fx.GraphModule:
    """`traced` with the forward values its backward reads chosen by the partitioner's
    `saver(parts, free_primals)` (saved or recomputed after the tangent); `free`: the
    placeholder positions of parameters (alive anyway, free to save). Returned unchanged
    when it has no single marked tangent."""
    tangent = tangent_node(traced)
    if tangent is None:
        return traced
    order = {n: i for i, n in enumerate(traced.graph.nodes)}
    loss = tangent.args[0]
    outs = output_nodes(traced)
    before = [o for o in outs if isinstance(o, torch.fx.Node) and order[o] < order[tangent]]
    after = [o for o in outs if isinstance(o, torch.fx.Node) and order[o] > order[tangent]]
    fw_outs = list(dict.fromkeys(before + [loss]))

    # the joint graph's form: primals, the tangent as an input; forward outputs, then the rest
    joint_graph = torch.fx.Graph()
    env: dict = {}
    prims = placeholders(traced)
    for p in prims:
        env[p] = joint_graph.placeholder(p.name)
        env[p].meta = dict(p.meta)
    t_in = joint_graph.placeholder("tangent")
    t_in.meta = dict(tangent.meta)
    env[tangent] = t_in
    for n in traced.graph.nodes:
        if n.op in ("placeholder", "output") or n is tangent:
            continue
        env[n] = joint_graph.node_copy(n, lambda a: env[a])
    joint_graph.output(tuple(env[o] for o in fw_outs + after))
    joint = graph_module(traced, joint_graph)
    layout = JointLayout(num_primals=len(prims), num_tangents=1, num_forward_outputs=len(fw_outs), grad_inputs=[])
    parts = joint_parts(joint, layout)
    free_nodes = {parts.primals[i] for i in free if i < len(parts.primals)}
    pair = split(joint, parts, saver(parts, free_nodes))

    # joined again: forward, the tangent (of the forward's loss), backward
    graph = torch.fx.Graph()
    new_prims = []
    for p in prims:
        q = graph.placeholder(p.name)
        q.meta = dict(p.meta)
        new_prims.append(q)
    fw_vals = _inline(graph, pair.forward, new_prims)
    value_of = dict(zip(fw_outs, fw_vals[:len(fw_outs)]))
    t_new = graph.node_copy(tangent, lambda a: value_of[a])
    bw_vals = _inline(graph, pair.backward, list(fw_vals[len(fw_outs):]) + [t_new])
    value_of.update(zip(after, bw_vals))
    graph.output([value_of[o] if isinstance(o, torch.fx.Node) else o for o in outs])
    joined = graph_module(traced, graph)
    joined.meta = dict(traced.meta)
    joined.meta["recomputed_after_backward"] = len(pair.recomputed)
    return joined


def _inline(graph: torch.fx.Graph, gm: torch.fx.GraphModule, inputs: list) -> list:
    """Copy `gm`'s nodes into `graph` with its placeholders bound to `inputs`; its outputs."""
    env = dict(zip(placeholders(gm), inputs))
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        env[n] = graph.node_copy(n, lambda a: env[a])
    return [env[o] if isinstance(o, torch.fx.Node) else o for o in output_nodes(gm)]
