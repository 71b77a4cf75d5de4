"""Backward graphs for calls where some outputs get no gradient.

Eager autograd never runs the backward of an output the loss does not use. The compiled
backward is one graph over every output's gradient, and a missing gradient enters it as
zeros: exact where those zeros are only added, copied, viewed or summed (HF models' unused
logits), but `0 / (2 * sqrt(0))` is NaN where eager computes nothing (fuzz 429014). For a
pattern of missing gradients whose zeros reach such an op, the backward is compiled again
without their contributions, once per pattern, on the first backward that has it."""

from __future__ import annotations

import logging
import math
import operator
from contextlib import nullcontext
from typing import Callable, Optional

import torch
import torch.fx

import observe

from .partition import is_view_op
from .readable import readable
from .trace import graph_module, output_nodes, placeholders

aten = torch.ops.aten

# Ops that map zero inputs to exact zeros whatever their other operands are (no 0 * inf).
_ZERO_EXACT = {aten.add.Tensor, aten.sub.Tensor, aten.neg.default, aten.clone.default,
               aten._to_copy.default, aten.copy.default, aten.sum.dim_IntList, aten.sum.default,
               aten.cat.default, aten.stack.default, aten.expand.default, aten.contiguous.default,
               aten.slice_scatter.default, aten.select_scatter.default, operator.getitem}


def tangent_reach(backward: torch.fx.GraphModule, num_tangents: int) -> dict:
    """For each backward node that some tangent reaches: which ones (bit j for tangent j)."""
    phs = placeholders(backward)
    reached = {t: 1 << j for j, t in enumerate(phs[len(phs) - num_tangents:])}
    for node in backward.graph.nodes:
        if node.op == "call_function":
            bits = 0
            for a in node.all_input_nodes:
                bits |= reached.get(a, 0)
            if bits:
                reached[node] = bits
    return reached


def zero_nodes(reached: dict, missing: tuple) -> set:
    """The nodes whose value is zero when the `missing` tangents are (reached: tangent_reach):
    the backward is linear in its tangents, so a node that only missing ones reach
    contributes nothing."""
    present = sum(1 << j for j, m in enumerate(missing) if not m)
    return {n for n, bits in reached.items() if not bits & present}


def saved_reader_masks(backward: torch.fx.GraphModule, num_tangents: int, reached: dict) -> list[int]:
    """For each saved input (the backward's placeholders before its tangents): which
    tangents reach a node that reads it (bit j for tangent j; reached: tangent_reach). A
    backward whose present gradients miss all of them does not need it, as eager's node for
    it never runs; a gradient computed without tangents reads it always (every bit)."""
    phs = placeholders(backward)
    every = (1 << num_tangents) - 1
    masks = []
    for saved in phs[:len(phs) - num_tangents]:
        bits, work, seen = 0, [saved], set()
        while work:       # through the tangent-free nodes (recomputation) to those that read it
            for user in work.pop().users:
                if user in seen:
                    continue
                seen.add(user)
                if user.op == "output":
                    bits = every
                elif user in reached:
                    bits |= reached[user]
                else:
                    work.append(user)
        masks.append(bits)
    return masks


def caller_writable(saved: list, outputs: list, primals: list, parameters: set) -> set[int]:
    """Which saved nodes the caller can write in place before the backward: the inputs
    (parameters aside: an optimizer writes them after the backward) and what shares memory
    with the forward's outputs. The graph's other intermediates are its own."""
    def base(n):
        while isinstance(n, torch.fx.Node) and n.op == "call_function" and is_view_op(n.target) and n.args:
            n = n.args[0]
        return n

    held = {base(o) for o in outputs if isinstance(o, torch.fx.Node)}
    held.update(p for p in primals if p not in parameters)
    return {i for i, n in enumerate(saved) if base(n) in held}


def _zero_exact(node: torch.fx.Node) -> bool:
    t = node.target
    if t in _ZERO_EXACT or is_view_op(t):
        return True
    if t in (aten.mul.Tensor, aten.div.Tensor) and len(node.args) == 2:
        other = node.args[1]      # a finite Python number: 0 * 2.0 is 0
        return isinstance(other, (int, float)) and math.isfinite(other) and (t is aten.mul.Tensor or other != 0)
    return False


def needs_pruning(zero: set) -> bool:
    """Whether the zeros reach an op that may not keep them zero (mul by a saved tensor that
    holds inf, a division by zero)."""
    return any(n.op == "call_function" and not _zero_exact(n) for n in zero)


def pruned(backward: torch.fx.GraphModule, zero: set) -> torch.fx.GraphModule:
    """`backward` computing what eager computes when the `zero` nodes' gradients are missing:
    an accumulation `a + zero` is `a`, and a zero that meets any other op (or is returned)
    is a fresh `zeros_like`, so nothing computed from it reaches a result. Same inputs and
    outputs as `backward`."""
    graph = torch.fx.Graph()
    env: dict = {}
    graph.output(graph.graph_copy(backward.graph, env))
    new_zero = {env[n] for n in zero}
    zeros: dict = {}

    def zeros_of(node):
        if node.op == "placeholder":        # a missing gradient: the caller passes zeros
            return node
        if node not in zeros:
            with graph.inserting_after(node):
                zeros[node] = graph.call_function(aten.zeros_like.default, (node,))
            zeros[node].meta = dict(node.meta)      # its user lines, for kernel provenance
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                # zeros_like's own layout: dense, where its input may be an expansion (stride 0)
                with getattr(val, "fake_mode", None) or nullcontext():
                    zeros[node].meta["val"] = aten.zeros_like.default(val)
        return zeros[node]

    for node in list(graph.nodes):
        if node in new_zero or node.op not in ("call_function", "output") or node in zeros.values():
            continue
        zin = [a for a in node.all_input_nodes if a in new_zero]
        if not zin:
            continue
        accumulates = node.op == "call_function" and node.target is aten.add.Tensor and not node.kwargs
        if accumulates and len(node.args) == 2 and len(zin) == 1:
            other = node.args[1] if node.args[0] is zin[0] else node.args[0]
            if isinstance(other, torch.fx.Node) and _same_layout(other, node):
                node.replace_all_uses_with(other)
                continue
        for a in zin:
            node.replace_input_with(a, zeros_of(a))
    graph.eliminate_dead_code()
    gm = graph_module(backward, graph, class_name="backward")
    gm.meta.update(backward.meta)
    return gm


def _same_layout(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.dtype == vb.dtype
            and va.shape == vb.shape and va.stride() == vb.stride())


class BackwardsByMissing:
    """For each pattern of missing gradients (a tuple of bools, one per tangent): the
    compiled backward to run (the full one where the zeros stay exact, else one compiled
    now), which of its results are computed only from missing gradients (those are None,
    as in eager, not zeros) and which saved inputs it does not need.

    `optional_saved`: the saved inputs that the caller can write in place (`writable`)
    and some pattern does not need. The runtime keeps them outside autograd's saved
    tensors, whose version check covers all of them at once: one saved only for an unused
    output and then written by the caller must not fail a backward that does not read it
    (eager's node for it never runs; fuzz 345578)."""

    def __init__(self, backward: torch.fx.GraphModule, examples: list, compiler: Callable,
                 full: Callable, num_tangents: int, compile_id, writable: set = frozenset()):
        self.backward, self.examples, self.compiler = backward, examples, compiler
        self.num_tangents, self.compile_id = num_tangents, compile_id
        self.by_pattern: dict = {}
        self.full = full
        self.reached = tangent_reach(backward, num_tangents)
        self.reader_masks = saved_reader_masks(backward, num_tangents, self.reached)
        every = (1 << num_tangents) - 1
        self.optional_saved = tuple(i for i, bits in enumerate(self.reader_masks) if bits != every and i in writable)

    def __call__(self, missing: tuple) -> tuple:
        found = self.by_pattern.get(missing)
        if found is None:
            zero = zero_nodes(self.reached, missing)
            absent = tuple(isinstance(o, torch.fx.Node) and o in zero for o in output_nodes(self.backward))
            found = self.by_pattern[missing] = (self._compile(missing, zero), absent, self.unread(missing))
        return found

    def unread(self, missing: tuple) -> frozenset:
        """The optional saved inputs that a backward with `missing` gradients does not need."""
        present = sum(1 << j for j, m in enumerate(missing) if not m)
        return frozenset(i for i in self.optional_saved if not self.reader_masks[i] & present)

    def stand_ins(self, missing: tuple, positions: list) -> Optional[list]:
        """Uninitialized tensors in the layouts of the saved inputs at `positions`, for a
        backward with `missing` gradients that reads none of them (an earlier backward freed
        their values), or None where it reads one or a layout is not static."""
        present = sum(1 << j for j, m in enumerate(missing) if not m)
        out = []
        for i in positions:
            ex = self.examples[i]
            if self.reader_masks[i] & present or not isinstance(ex, torch.Tensor) \
                    or not all(isinstance(s, int) for s in (*ex.shape, *ex.stride())):
                return None
            out.append(torch.empty_strided(tuple(ex.shape), ex.stride(), dtype=ex.dtype, device=ex.device))
        return out

    def _compile(self, missing: tuple, zero: set) -> Callable:
        if not needs_pruning(zero):
            return self.full
        gm = pruned(self.backward, zero)
        which = [j for j, m in enumerate(missing) if m]
        ctx = observe.compile_context(self.compile_id) if observe.current_compile_id() is None else nullcontext()
        with ctx, observe.stage("aot_compile_backward"):
            gid = gm.meta.get("aot_graph", ("backward", "?"))[1]
            observe.log("aot", logging.INFO, "backward graph %s: no gradient for tangents %s, whose zeros "
                        "would pass through ops eager never runs; compiling it without them", gid, which)
            observe.emit("aot_backward_graph", {"title": f"===== Backward graph {gid} (tangents {which} missing) ====="},
                         payload=lambda: readable(gm), log="aot_graphs")
            return self.compiler(gm, self.examples)
