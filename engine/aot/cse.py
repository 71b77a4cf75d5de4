"""Common subexpressions of a functional aten graph computed once.

Autocast casts a layer's input once per linear that reads it (a Llama block's q, k and v
projections: three `_to_copy` nodes of one tensor), and the backward of each recomputes
or re-casts what another already did. Each copy became a store of its own in the generated
kernels (a [tokens, hidden] bf16 tensor written three times a layer). The joint graph is
functional, so two calls of one pure op on the same arguments are one value; the later is
replaced by the earlier before the partitioner chooses what to save.

Not merged: ops that write (`Tensor(a!)`), draw random numbers, or return uninitialised
memory; nodes of an activation checkpoint with nodes outside it (they are recomputed, the
others saved); and a node the graph returns (or returns a view of), neither into another
node nor another into it: two outputs that are two tensors in eager stay two tensors, and
the backward never reads a tensor the caller holds unless eager's backward does (LayerNorm's
backward recomputes its normalized input; merged with a returned LayerNorm output, it was
saved, and a caller writing that output under no_grad broke a backward that eager runs)."""

from __future__ import annotations

import operator

import torch
import torch.fx

_UNINITIALISED = {torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided,
                  torch.ops.aten.new_empty, torch.ops.aten.new_empty_strided}


def _pure(node: torch.fx.Node) -> bool:
    t = node.target
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return False
    return not (t._schema.is_mutable or torch.Tag.nondeterministic_seeded in t.tags
                or t.overloadpacket in _UNINITIALISED)


def _returned(graph: torch.fx.Graph) -> set:
    """The nodes the graph returns, and the nodes those are views of."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    seen: set = set()
    work = list(out.all_input_nodes)
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "call_function" and (n.target is operator.getitem or getattr(n.target, "is_view", False)):
            work.extend(n.all_input_nodes)
    return seen


def _key(value, rep: dict):
    """A hashable form of an argument, nodes by their representative; type-tagged so that
    1, 1.0 and True stay apart. None when an argument cannot be keyed."""
    if isinstance(value, torch.fx.Node):
        return ("node", rep.get(value, value))
    if isinstance(value, (list, tuple)):
        parts = tuple(_key(v, rep) for v in value)
        return None if None in parts else (type(value).__name__, parts)
    if isinstance(value, dict):
        parts = tuple((k, _key(v, rep)) for k, v in sorted(value.items()))
        return None if any(p[1] is None for p in parts) else ("dict", parts)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                           torch.memory_format)):
        return (type(value).__name__, value)
    return None


def eliminate_common_subexpressions(gm: torch.fx.GraphModule) -> int:
    """Merge repeated pure calls in gm's graph, in place; returns how many were removed."""
    graph = gm.graph
    keep = _returned(graph)
    seen: dict = {}
    rep: dict = {}
    removed = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not _pure(node):
            continue
        args = _key(node.args, rep)
        kwargs = _key(node.kwargs, rep)
        if args is None or kwargs is None:
            continue
        key = (node.target, args, kwargs, node.meta.get("recompute"))
        first = seen.get(key)
        if first is None or (first in keep and node not in keep):
            seen[key] = node
        elif node not in keep:
            rep[node] = first
            # the kernel that computes it names both source lines (codegen/provenance.py)
            merged = first.meta.get("fx_origins", ()) + node.meta.get("fx_origins", ())
            if merged:
                first.meta["fx_origins"] = tuple(dict.fromkeys(merged))
            traces = [t for t in [node.meta.get("stack_trace"), *node.meta.get("merged_stack_traces", ())] if t]
            if traces:
                first.meta["merged_stack_traces"] = first.meta.get("merged_stack_traces", []) + traces
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            removed += 1
    if removed:
        gm.recompile()
    return removed
