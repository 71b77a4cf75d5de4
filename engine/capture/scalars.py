"""Captured scalar outputs (`config.capture_scalar_outputs`): `.item()` / `.tolist()` become
graph nodes whose value is an *unbacked* symbol (u0, zuf0: no value known at trace time).
The symbol flows on as a ConstantVariable holding a SymInt/SymFloat; where a graph op
needs it, the graph value is rebuilt from its sympy expression over the item() nodes, and
where generated code needs it (live at a graph break, returned), it is a graph output.
Python control flow on it cannot be decided at trace time: a graph break (GB0019)."""

from __future__ import annotations

import dataclasses
import operator

import sympy
import torch
import torch.fx

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


_ADD_MUL = {sympy.Add: operator.add, sympy.Mul: operator.mul}
_RELATIONS = {sympy.StrictGreaterThan: operator.gt, sympy.GreaterThan: operator.ge,
              sympy.StrictLessThan: operator.lt, sympy.LessThan: operator.le,
              sympy.Eq: operator.eq, sympy.Ne: operator.ne}


def _build(env, expr):
    from ..shapes.symbolic import _placeholder

    if expr is sympy.true or expr is sympy.false:
        return bool(expr)
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Rational):
        return float(expr)
    if isinstance(expr, sympy.Float):
        return float(expr)
    if isinstance(expr, sympy.Symbol):
        proxy = env.symbol_placeholders.get(expr)
        return proxy if proxy is not None else _placeholder(env, expr)  # a backed size: a graph input
    op = _ADD_MUL.get(type(expr))
    if op is not None:
        args = [_build(env, a) for a in expr.args]
        acc = args[0]
        for a in args[1:]:
            acc = op(acc, a)
        return acc
    rel = _RELATIONS.get(type(expr))
    if rel is not None:
        return rel(_build(env, expr.lhs), _build(env, expr.rhs))
    if isinstance(expr, sympy.Pow) and isinstance(expr.exp, sympy.Integer):
        e = int(expr.exp)
        base = _build(env, expr.base)
        return base ** e if e > 0 else 1.0 / (base ** -e)
    name = type(expr).__name__
    if name == "ToFloat":
        return torch.sym_float(_build(env, expr.args[0]))
    if name in ("FloorDiv", "IntTrueDiv", "FloatTrueDiv"):
        f = operator.floordiv if name == "FloorDiv" else operator.truediv
        return f(_build(env, expr.args[0]), _build(env, expr.args[1]))
    if name in ("PythonMod", "Mod"):
        return _build(env, expr.args[0]) % _build(env, expr.args[1])
    raise NotImplementedError(name)


def to_proxy(value):
    """The graph value of a number that depends on captured scalars (or a container of
    them). Raises NotImplementedError for an expression it cannot rebuild."""
    if isinstance(value, SYM_TYPES):
        if not is_unbacked(value):
            from ..shapes.symbolic import to_proxy as backed
            return backed(value)
        env = value.node.shape_env
        return _build(env, env.simplify(value.node.expr))
    if isinstance(value, torch.Size) or type(value) is tuple:
        return tuple(to_proxy(v) for v in value)
    if type(value) is list:
        return [to_proxy(v) for v in value]
    if isinstance(value, slice):
        return slice(to_proxy(value.start), to_proxy(value.stop), to_proxy(value.step))
    return value


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
