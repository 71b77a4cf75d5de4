"""Activation checkpointing: `torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)`.

The checkpointed function is traced into the graph like any call, and every node it makes
is tagged `meta["recompute"] = "must"` with its region in `meta["ac_graph_id"]`. make_fx
copies both fields onto the aten nodes it traces from a node, and the AOT partitioner
(engine/aot/mincut.py) saves none of a region's results for the backward: it saves the
region's inputs and recomputes the rest, as eager checkpointing does. Random ops stay
saved (recomputing them would draw new numbers).

The reentrant form (`use_reentrant=True`, torch's default when the argument is left out)
runs an autograd.Function whose backward calls back into autograd: it is a graph break
that says how to get the compiled form."""

from __future__ import annotations

import torch
import torch.utils.checkpoint as torch_checkpoint

from .graph_breaks import GraphBreak

_CHECKPOINT_OPTIONS = ("use_reentrant", "context_fn", "determinism_check", "debug", "early_stop",
                       "preserve_rng_state")


def call_checkpoint(tx, args, kwargs):
    """checkpoint(fn, *args, use_reentrant=..., ...)."""
    if not args:
        raise GraphBreak("GB0011", "torch.utils.checkpoint.checkpoint without a function")
    fn, fn_args = args[0], list(args[1:])
    options = {k: tx.as_python(v) for k, v in kwargs.items() if k in _CHECKPOINT_OPTIONS}
    fn_kwargs = {k: v for k, v in kwargs.items() if k not in _CHECKPOINT_OPTIONS}
    if options.get("use_reentrant") is not False:
        raise GraphBreak("GB0012", "torch.utils.checkpoint.checkpoint with use_reentrant=True (torch's default "
                                   "when it is left out): pass use_reentrant=False to compile the checkpointed "
                                   "function, recomputed in the backward")
    if options.get("context_fn", torch_checkpoint.noop_context_fn) is not torch_checkpoint.noop_context_fn:
        raise GraphBreak("GB0012", "torch.utils.checkpoint.checkpoint with a context_fn (selective checkpointing)")
    out = tx.out
    outer = out.checkpoint_region
    out.checkpoint_regions += 1
    out.checkpoint_region = out.checkpoint_regions if outer is None else outer  # a nested one is the same region
    try:
        return tx.call(fn, fn_args, fn_kwargs)
    finally:
        out.checkpoint_region = outer


def tag(node: torch.fx.Node, region) -> None:
    node.meta["recompute"] = "must"
    node.meta["ac_graph_id"] = region
