"""Captured scalar outputs (`config.capture_scalar_outputs`): `.item()` / `.tolist()` become
graph nodes whose value is an *unbacked* symbol (u0, zuf0: no value known at trace time).
The symbol flows on as a ConstantVariable holding a SymInt/SymFloat; where a graph op
needs it, the graph value is rebuilt from its sympy expression over the item() nodes, and
where generated code needs it (live at a graph break, returned), it is a graph output.
Python control flow on it cannot be decided at trace time: a graph break (GB0019)."""

from __future__ import annotations

import dataclasses

import sympy
import torch
import torch.fx

from ..shapes.symbolic import build_graph_expr, map_items, to_proxy as backed_to_proxy

try:
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, free_unbacked_symbols
except ImportError:  # pragma: no cover
    GuardOnDataDependentSymNode = ()  # type: ignore[assignment]

    def free_unbacked_symbols(x):  # type: ignore[no-redef]
        return set()

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def enable(fake_mode) -> None:
    """Let the fake mode answer `.item()` with an unbacked symbol instead of raising."""
    env = fake_mode.shape_env
    if env is not None and not env.allow_scalar_outputs:
        env.settings = dataclasses.replace(env.settings, allow_scalar_outputs=True)


def is_unbacked(value) -> bool:
    """Does `value` (a number, SymInt/SymFloat/SymBool, or a container of them) depend on
    a captured scalar?"""
    if isinstance(value, SYM_TYPES):
        return bool(free_unbacked_symbols(value))
    if isinstance(value, (tuple, list)):
        return any(is_unbacked(v) for v in value)
    if isinstance(value, slice):
        return is_unbacked((value.start, value.stop, value.step))
    return False


def register(proxy, value) -> None:
    """`proxy` (an item() node) computes the fresh unbacked symbol of `value`."""
    expr = value.node.expr
    if isinstance(expr, sympy.Symbol):
        value.node.shape_env.symbol_placeholders[expr] = proxy
    proxy.node.meta["example_value"] = value
    proxy.node.meta["val"] = value


def to_proxy(value):
    """The graph value of a number that depends on captured scalars (or a container of
    them). Raises NotImplementedError for an expression it cannot rebuild."""
    if isinstance(value, SYM_TYPES):
        if not is_unbacked(value):
            return backed_to_proxy(value)
        env = value.node.shape_env
        return build_graph_expr(env, env.simplify(value.node.expr), numbers=True)
    return map_items(to_proxy, value)


def output_node(value):
    """An FX node computing `value` (a SymInt/SymFloat/SymBool on captured scalars), for the
    graph's outputs; None when it cannot be rebuilt."""
    try:
        p = to_proxy(value)
    except NotImplementedError:
        return None
    if isinstance(p, torch.fx.Proxy):
        p.node.meta.setdefault("example_value", value)
        return p.node
    return None
