"""Which captured FX nodes each aten node came from.

Forward nodes are made while the captured graph runs node by node, so torch.fx's
`from_node` names the captured node. Backward nodes are made by autograd; the trace's hooks
give them the sequence number of the forward op they differentiate (`seq_nr`, as torch's
own AOT stage does), and this pass gives them that op's captured nodes. The result is one
meta key, `fx_origins`, that codegen reads to say what each kernel fuses."""

from __future__ import annotations

import torch.fx


def _captured_names(sources) -> tuple:
    """The captured graph's node names behind a chain of NodeSources (the oldest pass)."""
    names = []
    for src in sources or ():
        while getattr(src, "from_node", None):
            src = src.from_node[0]
        if src.name not in names:
            names.append(src.name)
    return tuple(names)


def stamp(gm: torch.fx.GraphModule) -> None:
    """Set meta["fx_origins"] on every op node of a traced aten graph."""
    by_seq: dict = {}
    for node in gm.graph.nodes:
        names = _captured_names(node.meta.get("from_node"))
        if names:
            node.meta["fx_origins"] = names
            seq = node.meta.get("seq_nr")
            if seq is not None:
                by_seq.setdefault(seq, names)
    for node in gm.graph.nodes:
        if node.op == "call_function" and "fx_origins" not in node.meta:
            names = by_seq.get(node.meta.get("seq_nr"))
            if names:
                node.meta["fx_origins"] = names
