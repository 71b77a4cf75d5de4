"""A graph cut down to some of its nodes: what the minifier compiles on each trial.

The nodes of a graph are grouped into units (an op, with the `getitem`s that unpack its
tuple result), the things delta debugging keeps or drops. A kept unit whose argument was
dropped reads it as a new graph input instead, of the recorded shape, stride and dtype;
kept values that a dropped node (or the graph's output) used become the cut graph's
outputs. Non-tensor inputs (sizes of a dynamic shape, say) may also be folded into
constants."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Optional, Sequence

import torch
import torch.fx

from ..fx_runnable import _spec

OP_KINDS = ("call_function", "call_method", "call_module")


@dataclasses.dataclass(frozen=True)
class Unit:
    """One op node and the getitem nodes that unpack its result (kept or dropped together)."""

    nodes: tuple[str, ...]


@dataclasses.dataclass
class GraphCase:
    """A graph, the concrete value every node had on one run, and its units in graph order."""

    gm: torch.fx.GraphModule
    values: dict[str, Any]
    units: list[Unit]

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> "GraphCase":
        values = record_values(gm, example_inputs)
        return cls(gm, values, units_of(gm, values))

    def node_count(self, kept: Sequence[int]) -> int:
        return sum(len(self.units[i].nodes) for i in kept)

    def build(self, kept: Sequence[int], folded: frozenset = frozenset()) -> Optional[torch.fx.GraphModule]:
        """The graph of the kept units (indices into `units`), None when it cannot be a
        program: an input it would need has no value that can be made again (a tuple, an
        object), or nothing is left to compute. `folded`: names of non-tensor inputs
        replaced by their recorded value."""
        keep = {name for i in kept for name in self.units[i].nodes}
        if not keep:
            return None
        graph = self.gm.graph
        new = torch.fx.Graph()
        env: dict[torch.fx.Node, Any] = {}
        inputs = _inputs_needed(graph, keep)
        for node in inputs:
            value = self.values.get(node.name, _missing)
            if node.name in folded and _foldable(value):
                env[node] = value
                continue
            if node.op == "get_attr":   # parameters and constants stay attributes of the graph
                env[node] = new.get_attr(node.target)
            elif value is _missing or _spec(value)[0] == "unknown":
                return None
            else:
                env[node] = new.placeholder(node.name)
            env[node].meta = dict(node.meta)
        for node in graph.nodes:
            if node.name in keep:
                env[node] = new.node_copy(node, lambda n: env[n])
        outputs = [env[n] for n in _outputs(graph, keep, self.values)]
        if not outputs:
            return None
        new.output(tuple(outputs))
        new.lint()
        return torch.fx.GraphModule(self.gm, new)

    def inputs_of(self, gm: torch.fx.GraphModule) -> list:
        """The recorded values of a cut graph's placeholders (for their specs)."""
        return [self.values[n.target] for n in gm.graph.nodes if n.op == "placeholder"]

    def scalar_inputs(self, kept: Sequence[int]) -> list[str]:
        """Names of the non-tensor inputs the kept units read (candidates for folding)."""
        keep = {name for i in kept for name in self.units[i].nodes}
        return [n.name for n in _inputs_needed(self.gm.graph, keep)
                if n.op != "get_attr" and _foldable(self.values.get(n.name, _missing))]


_missing = object()


def _foldable(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) and not isinstance(value, torch.Tensor)


def _inputs_needed(graph: torch.fx.Graph, keep: set) -> list[torch.fx.Node]:
    """Nodes outside `keep` that kept nodes read, in graph order (so that the original
    graph's inputs come first, in their order)."""
    needed: set = set()
    for node in graph.nodes:
        if node.name in keep:
            needed.update(n for n in node.all_input_nodes if n.name not in keep)
    return [n for n in graph.nodes if n in needed]


def _outputs(graph: torch.fx.Graph, keep: set, values: dict) -> list[torch.fx.Node]:
    """Kept nodes whose value leaves the kept set (read by a dropped node or by the
    graph's output), or that nothing reads; tensors and numbers only (a tuple is returned
    through its getitems, which are in its unit)."""
    out = []
    for node in graph.nodes:
        if node.name not in keep:
            continue
        value = values.get(node.name, _missing)
        if not isinstance(value, (torch.Tensor, int, float, bool, torch.SymInt)):
            continue
        if not node.users or any(u.name not in keep for u in node.users):
            out.append(node)
    return out


def units_of(gm: torch.fx.GraphModule, values: dict) -> list[Unit]:
    units: list[list[str]] = []
    owner: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op not in OP_KINDS:
            continue
        parent = node.args[0] if node.target is operator.getitem and node.args else None
        if isinstance(parent, torch.fx.Node) and parent.name in owner \
                and isinstance(values.get(parent.name), (tuple, list)):
            units[owner[parent.name]].append(node.name)   # unpacks its parent's tuple
            owner[node.name] = owner[parent.name]
            continue
        owner[node.name] = len(units)
        units.append([node.name])
    return [Unit(tuple(u)) for u in units]


def record_values(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> dict[str, Any]:
    """Every node's value on one eager run; a node after an op that raised (or that the run
    never reached) keeps its graph metadata's example value, if any."""
    values: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            values[n.name] = result
            return result

    try:
        with torch.no_grad():
            Recorder(gm).run(*example_inputs)
    except Exception:
        pass
    for node in gm.graph.nodes:
        if node.name not in values:
            meta = node.meta.get("example_value", node.meta.get("val", _missing))
            if meta is not _missing:
                values[node.name] = meta
    return values
