"""The min-cut partitioner: save the cheapest set of tensors from which the backward can
recompute everything else it needs, recomputing only cheap ops (views, pointwise ops,
constants). A max-flow / min-cut over the joint graph's forward part:

  source -> every primal (and every op that must not be recomputed: matmuls, reductions,
            random ops) with infinite capacity, but for ops inside an activation checkpoint
            (meta["recompute"], engine/capture/checkpoint.py), which are never saved;
  node_in -> node_out with capacity = bytes of the node's output (the cost of saving it);
  node_out -> user_in with infinite capacity;
  node_out -> sink (infinite) where a backward node reads a forward node.

A minimum cut is a cheapest set of saved tensors that separates the forward from the
backward; everything on the sink side is recomputed in the backward."""

from __future__ import annotations

import collections
import operator

import torch
import torch.fx

from ..exact_values import compared_with_its_extreme
from .partition import JointParts, is_view_op, must_recompute, tensor_bytes

INF = 1 << 62
AVOID = 1 << 48      # more than any set of tensors costs, less than a cut that cannot be made

# Non-pointwise ops that are as cheap to recompute as to read.
_CHEAP_PACKETS = {
    "full", "zeros", "ones", "scalar_tensor", "arange", "_to_copy", "clone", "expand", "empty",
    "lift_fresh_copy", "new_zeros", "new_ones", "new_full", "zeros_like", "ones_like", "full_like",
    "empty_like", "fill", "_unsafe_view", "view", "reshape",
    "scatter",   # one element a row into a tensor: a loss's one-hot target, [tokens, vocabulary]
}


def recomputable(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    t = node.target
    if t is operator.getitem:
        return True
    if not isinstance(t, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in t.tags:
        return False
    if is_view_op(t) or torch.Tag.pointwise in t.tags:
        return True
    return t.overloadpacket.__name__ in _CHEAP_PACKETS


class _FlowGraph:
    """Dinic's max-flow on integer capacities."""

    def __init__(self) -> None:
        self.head: dict = collections.defaultdict(list)   # vertex -> edge ids
        self.to: list = []
        self.cap: list[int] = []

    def add_edge(self, u, v, cap: int) -> None:
        self.head[u].append(len(self.to)); self.to.append(v); self.cap.append(cap)
        self.head[v].append(len(self.to)); self.to.append(u); self.cap.append(0)

    def _levels(self, s, t):
        level = {s: 0}
        q = collections.deque([s])
        while q:
            u = q.popleft()
            for e in self.head[u]:
                v = self.to[e]
                if self.cap[e] > 0 and v not in level:
                    level[v] = level[u] + 1
                    q.append(v)
        return level if t in level else None

    def max_flow(self, s, t) -> int:
        total = 0
        while (level := self._levels(s, t)) is not None:
            it = {u: 0 for u in level}

            def push(u, f):
                if u == t:
                    return f
                edges = self.head[u]
                while it[u] < len(edges):
                    e = edges[it[u]]
                    v = self.to[e]
                    if self.cap[e] > 0 and level.get(v) == level[u] + 1:
                        got = push(v, min(f, self.cap[e]))
                        if got:
                            self.cap[e] -= got
                            self.cap[e ^ 1] += got
                            return got
                    it[u] += 1
                return 0

            while (f := push(s, INF)):
                total += f
        return total

    def reaching(self, t) -> set:
        """Vertices that can still reach t in the residual graph."""
        rev: dict = collections.defaultdict(list)
        for u, edges in self.head.items():
            for e in edges:
                if self.cap[e] > 0:
                    rev[self.to[e]].append(u)
        seen = {t}
        q = collections.deque([t])
        while q:
            v = q.popleft()
            for u in rev[v]:
                if u not in seen:
                    seen.add(u)
                    q.append(u)
        return seen

    def reachable(self, s) -> set:
        seen = {s}
        q = collections.deque([s])
        while q:
            u = q.popleft()
            for e in self.head[u]:
                v = self.to[e]
                if self.cap[e] > 0 and v not in seen:
                    seen.add(v)
                    q.append(v)
        return seen


def _backward_readers(node: torch.fx.Node, backward: set):
    """The backward nodes that read `node` or a view of it."""
    work, seen = [node], set()
    while work:
        for user in work.pop().users:
            if user in seen:
                continue
            seen.add(user)
            if user in backward:
                yield user
            if user.op == "call_function" and is_view_op(user.target):
                work.append(user)


def _cast_of_parameters_read_whole(node: torch.fx.Node, free: set, backward: set) -> bool:
    """A parameter's copy (autocast's bf16 weight) that a backward matmul reads: recomputing
    it re-reads every float32 weight and writes the copy again, in each backward, where
    saving it keeps the forward's (Llama-1B training on an H200: 1.1 ms of GPU time of a
    32 ms step). PyTorch's partitioner saves it too (`ban_if_materialized_backward`)."""
    if node.target is not torch.ops.aten._to_copy.default or not node.args or node.args[0] not in free:
        return False
    return any(not _fuses_its_inputs(user) for user in _backward_readers(node, backward))


def _fuses_its_inputs(node: torch.fx.Node) -> bool:
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and (torch.Tag.pointwise in t.tags or is_view_op(t))


def min_cut_saved(parts: JointParts, free_primals: set = frozenset()) -> list[torch.fx.Node]:
    """The nodes to save. `free_primals` (parameters: alive anyway) cost nothing to save.
    Other inputs are saved only where the backward reads them, as eager's ops save them, or
    where nothing else can be (an input of an activation checkpoint): saved only to
    recompute a forward op (a BatchNorm buffer to recompute `t > running`, an activation
    to recompute `y > softmax(z)`), an input the caller then writes in place (the next
    graph's `running.mul_(0.9)`, `y.mul_(2)`) fails the backward's version check where
    eager, which saved the comparison, runs (fuzz 425449, 420327, 902531)."""
    import sys

    g = _FlowGraph()
    backward = parts.tangent_dependent
    candidates = [n for n in parts.graph.nodes if n.op != "output" and n not in backward]
    cand = set(candidates)
    grads = {n for n in parts.grad_outputs if isinstance(n, torch.fx.Node)}
    for node in candidates:
        if node.op == "placeholder":
            g.add_edge("source", (node, "in"), INF)
            cost = 0 if node in free_primals else tensor_bytes(node)
            if node not in free_primals and not any(_backward_readers(node, backward)):
                cost = AVOID
        else:
            val = node.meta.get("val")
            # A tuple-valued node cannot be saved (its getitems can); a scalar costs a word.
            cost = tensor_bytes(node) if isinstance(val, torch.Tensor) else (
                INF if isinstance(val, (tuple, list)) or val is None else 8)
            if must_recompute(node):
                cost = INF   # inside torch.utils.checkpoint: recomputed in the backward, never saved
            elif not recomputable(node) or compared_with_its_extreme(node) \
                    or _cast_of_parameters_read_whole(node, free_primals, backward):
                g.add_edge("source", (node, "in"), INF)
        g.add_edge((node, "in"), (node, "out"), cost)
        for user in node.users:
            if user in cand:
                g.add_edge((node, "out"), (user, "in"), INF)
            elif user.op != "output" and user in backward:
                g.add_edge((node, "out"), "sink", INF)
        if node in grads:   # a gradient computed without any tangent
            g.add_edge((node, "out"), "sink", INF)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * len(candidates) + 1000))
    try:
        g.max_flow("source", "sink")
    finally:
        sys.setrecursionlimit(limit)
    # Of all minimum cuts, take the one nearest the backward: equal bytes, least recomputation.
    sink_side = g.reaching("sink")
    return [n for n in candidates if (n, "in") not in sink_side and (n, "out") in sink_side]
