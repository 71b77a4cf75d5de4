"""Collectives in user code: `dist.all_reduce(t)` and its kin, and the functional
collectives (`torch.distributed._functional_collectives`, `torch.distributed.nn.functional`).

The capture does not put them in graphs: each is a graph break (GB0020) whose call runs
eagerly with the real tensors, so every rank makes the same calls in the same order and
the result is exactly eager's. Were a collective traced on one rank and broken on another,
the ranks would still agree on the calls; what makes ranks hang is a different order,
which `tlparse --all-ranks-html` compares."""

from __future__ import annotations

# distributed_c10d's functions that talk to other ranks (the rest there only ask about groups)
C10D_COLLECTIVES = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_coalesced",
    "all_gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "broadcast",
    "broadcast_object_list", "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "gather",
    "gather_object", "scatter", "scatter_object_list", "send", "recv", "isend", "irecv",
    "batch_isend_irecv", "send_object_list", "recv_object_list", "_reduce_scatter_base",
    "_all_gather_base",
})
FUNCTIONAL_MODULES = ("torch.distributed._functional_collectives", "torch.distributed.nn.functional")
# questions about this process whose answers stay fixed for the life of the job: evaluated
# while tracing (no guard), as torch.compile does, so `x / dist.get_world_size()` stays in the graph
PROCESS_QUERIES = frozenset({"get_rank", "get_world_size", "is_initialized", "is_available", "get_backend"})


def is_process_query(fn) -> bool:
    mod = getattr(fn, "__module__", None) or ""
    return mod in ("torch.distributed.distributed_c10d", "torch.distributed") and \
        getattr(fn, "__name__", "") in PROCESS_QUERIES


def collective_name(fn) -> str | None:
    """`torch.distributed.all_reduce` (the name a user knows) when `fn` is a collective."""
    mod = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__name__", "")
    if mod == "torch.distributed.distributed_c10d" and name in C10D_COLLECTIVES:
        return f"torch.distributed.{name}"
    if mod.startswith(FUNCTIONAL_MODULES) and not name.startswith("_"):
        return f"{mod}.{name}"
    return None
