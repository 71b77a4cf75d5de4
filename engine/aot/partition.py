"""Splitting the joint graph into a forward graph and a backward graph.

The forward graph takes every primal and returns its outputs followed by the saved
tensors; the backward graph takes the saved tensors then the tangents and returns the
gradients. Partitioners only choose *which* joint nodes are saved; `split` builds both
graphs from that choice, recomputing in the backward whatever it needs and was not saved."""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

import torch
import torch.fx

from .trace import JointLayout, graph_module, output_nodes, placeholders


@dataclasses.dataclass
class JointParts:
    """The joint graph's nodes by role."""

    graph: torch.fx.Graph
    primals: list[torch.fx.Node]
    tangents: list[torch.fx.Node]
    forward_outputs: list[torch.fx.Node]
    grad_outputs: list[torch.fx.Node]
    tangent_dependent: set            # nodes computed from a tangent: backward-only
    forward_needed: set               # ancestors of the forward outputs (from the primals)


def joint_parts(joint: torch.fx.GraphModule, layout: JointLayout) -> JointParts:
    ph = placeholders(joint)
    primals, tangents = ph[:layout.num_primals], ph[layout.num_primals:]
    outs = output_nodes(joint)
    fw_outs, grad_outs = outs[:layout.num_forward_outputs], outs[layout.num_forward_outputs:]
    dependent = set(tangents)
    for node in joint.graph.nodes:
        if node.op != "output" and any(a in dependent for a in node.all_input_nodes):
            dependent.add(node)
    return JointParts(joint.graph, primals, tangents, fw_outs, grad_outs, dependent,
                      ancestors([n for n in fw_outs if isinstance(n, torch.fx.Node)], stop=set()))


def ancestors(roots: Iterable, stop: set) -> set:
    """Every node the roots need, not looking past `stop` nodes (which are included)."""
    seen: set = set()
    work = [r for r in roots if isinstance(r, torch.fx.Node)]
    while work:
        n = work.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in stop:
            continue
        work.extend(n.all_input_nodes)
    return seen


def default_saved(parts: JointParts) -> list[torch.fx.Node]:
    """Save every forward value the backward uses: the forward computes exactly what its
    outputs need, the backward everything else, reading the forward's values (but for values
    inside an activation checkpoint, which the backward computes again from the checkpoint's
    inputs)."""
    fw = {n for n in parts.forward_needed if not must_recompute(n)} | set(parts.primals)
    backward = ancestors(parts.grad_outputs, stop=fw)
    saved = {n for n in backward if n in fw}
    return [n for n in parts.graph.nodes if n in saved]


def must_recompute(node: torch.fx.Node) -> bool:
    """Made inside torch.utils.checkpoint (engine/capture/checkpoint.py: make_fx copies the
    tag onto the aten nodes), and not random (recomputing would draw new numbers)."""
    if node.meta.get("recompute") != "must":
        return False
    t = node.target
    return not (isinstance(t, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in t.tags)


def tensor_bytes(node: torch.fx.Node) -> int:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return int(val.numel()) * val.element_size()
    return 0


@dataclasses.dataclass
class Split:
    forward: torch.fx.GraphModule
    backward: torch.fx.GraphModule
    saved: list[torch.fx.Node]            # joint nodes, in forward-output order
    recomputed: list[str]                 # joint nodes the backward computes again

    @property
    def saved_bytes(self) -> int:
        return sum(tensor_bytes(n) for n in self.saved)


def split(joint: torch.fx.GraphModule, parts: JointParts, saved: list[torch.fx.Node],
          mutated_primals: frozenset = frozenset()) -> Split:
    stop = set(saved) | set(parts.tangents)
    bw_nodes = ancestors(parts.grad_outputs, stop=stop)
    leaked = [n for n in parts.primals if n in bw_nodes and n not in stop]
    if leaked:
        raise AssertionError(f"partition leaves primals {[n.name for n in leaked]} unsaved but needed by the backward")
    saved = [n for n in saved if n in bw_nodes]          # a partitioner may over-approximate
    # runtime asserts (on data-dependent sizes, engine/shapes/runtime_asserts.py) run in the
    # forward, where their sizes are known; nothing consumes them, so nothing else keeps them
    forward = extract(joint, parts.primals, parts.forward_outputs + saved, "forward",
                      keep=runtime_checks(parts.graph, parts.tangent_dependent))
    of_mutated = [view_base(n) in mutated_primals for n in saved]
    if any(of_mutated):
        _clone_saved_inputs(forward, len(parts.forward_outputs), of_mutated)
    backward = extract(joint, saved + parts.tangents, parts.grad_outputs, "backward")
    fw_set = ancestors(parts.forward_outputs + saved, stop=set(parts.primals))
    recomputed = [n.name for n in parts.graph.nodes
                  if n in bw_nodes and n not in stop and n not in parts.tangent_dependent and n in fw_set]
    return Split(forward, backward, saved, recomputed)


def is_view_op(target) -> bool:
    """An aten op whose result aliases its argument (`Tensor(a)` in the schema, not written)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def view_base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose memory `node` is a view of (itself when it is no view)."""
    while node.op == "call_function" and is_view_op(node.target) and node.args:
        node = node.args[0]
    return node


def _clone_saved_inputs(forward: torch.fx.GraphModule, num_outputs: int, which: list[bool]) -> None:
    """A saved input, or a view of one, that the epilogue then mutates in place must be saved
    as a copy of its value before the call: the backward needs the old value (and autograd
    refuses a view that was made under the forward's no_grad and then written)."""
    out = next(n for n in forward.graph.nodes if n.op == "output")
    values = list(out.args[0])
    with forward.graph.inserting_before(out):
        for k, flag in enumerate(which):
            if flag:
                src = values[num_outputs + k]
                clone = forward.graph.call_function(torch.ops.aten.clone.default, (src,))
                clone.meta = dict(src.meta)
                values[num_outputs + k] = clone
    out.args = (tuple(values),)
    forward.recompile()


def runtime_checks(graph: torch.fx.Graph, exclude: set = frozenset()) -> list:
    """The graph's asserts (`aten._assert_scalar` on data-dependent sizes): nothing consumes
    them, so the graphs extracted from a trace keep them explicitly."""
    effects = torch.fx.node._side_effectful_functions
    return [n for n in graph.nodes if n.op == "call_function" and n.target in effects and n not in exclude]


def extract(joint: torch.fx.GraphModule, inputs: list, outputs: list, name: str,
            keep: Iterable = ()) -> torch.fx.GraphModule:
    """A flat graph (inputs as placeholders in order, a tuple of outputs) with the joint
    nodes the outputs (and the `keep` nodes) need, in the joint's order."""
    graph = torch.fx.Graph()
    env: dict = {}
    for node in inputs:
        p = graph.placeholder(node.name)
        p.meta = dict(node.meta)
        env[node] = p
    needed = ancestors(list(outputs) + list(keep), stop=set(inputs))
    for node in joint.graph.nodes:
        if node in needed and node not in env:
            if node.op == "placeholder":
                raise AssertionError(f"{name} graph needs {node.name}, which is not among its inputs")
            env[node] = graph.node_copy(node, lambda a: env[a])
    graph.output(tuple(env[o] if isinstance(o, torch.fx.Node) else o for o in outputs))
    return graph_module(joint, graph, class_name=name)


Partitioner = Callable[[JointParts], list]
