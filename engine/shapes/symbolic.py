"""Symbolic values met during a trace (SymInt sizes and what is computed from them), turned
into the two things the capture needs: a graph value (a placeholder that carries the symbol,
or arithmetic on placeholders) and a Python expression for the generated code (`L['x'].size()[0] * 2`)."""

from __future__ import annotations

import operator

import sympy
import torch
import torch.fx

from .env import EngineShapeEnv
from .guards import symbol_names
from .printer import python_text
from .sources import SymbolInputSource

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def has_symbolic(value) -> bool:
    if isinstance(value, SYM_TYPES):
        return True
    if isinstance(value, (tuple, list)):
        return any(has_symbolic(v) for v in value)
    if isinstance(value, slice):
        return has_symbolic((value.start, value.stop, value.step))
    return False


def _env_of(sym) -> EngineShapeEnv:
    env = sym.node.shape_env
    if not isinstance(env, EngineShapeEnv):
        raise TypeError("a symbolic value from another shape environment")
    return env


def _canonical(sym):
    env = _env_of(sym)
    return env, env.simplify(sym.node.expr)


def _literal(v):
    return repr(v) if v is None or type(v) in (int, float, bool, str) else None


def python_expr(value) -> str | None:
    """Python text computing `value` (a SymInt/SymFloat/SymBool, or a tuple/list/Size with
    some) from the frame's `L` and `G`; None when `value` holds nothing symbolic."""
    if isinstance(value, SYM_TYPES):
        env, expr = _canonical(value)
        text = python_text(expr, symbol_names(env))
        if isinstance(value, torch.SymFloat):
            return f"float({text})"
        if isinstance(value, torch.SymBool):
            return f"bool({text})"
        return f"int({text})" if not isinstance(expr, sympy.Symbol) else text
    if isinstance(value, slice) and has_symbolic(value):
        parts = [python_expr(v) if has_symbolic(v) else _literal(v) for v in (value.start, value.stop, value.step)]
        if any(p is None for p in parts):
            return None
        return f"slice({', '.join(parts)})"
    if isinstance(value, (tuple, list)) and has_symbolic(value):
        items = [python_expr(v) if has_symbolic(v) else _literal(v) for v in value]
        if any(i is None for i in items):
            return None
        if isinstance(value, torch.Size):
            return f"___torch_Size([{', '.join(items)}])"
        if type(value) is list:
            return f"[{', '.join(items)}]"
        if type(value) is tuple:
            return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        return None
    return None


_SYMPY_OPS = {sympy.Add: operator.add, sympy.Mul: operator.mul}


def _placeholder(env: EngineShapeEnv, sym: sympy.Symbol):
    proxy = env.symbol_placeholders.get(sym)
    if proxy is not None:
        return proxy
    out = env.owner
    name = symbol_names(env)[sym]
    source = SymbolInputSource(name)
    graph = out.graph
    first = next(iter(graph.nodes), None)
    ctx = graph.inserting_before(first) if first is not None else graph.inserting_after(None)
    with ctx:
        node = graph.placeholder(source.graph_input_name())
    hint = int(env.backed_var_to_val[sym]) if sym in env.backed_var_to_val else None
    value = env.create_symintnode(sym, hint=hint)
    node.meta["example_value"] = value
    node.meta["val"] = value
    node.meta["source"] = name
    proxy = torch.fx.Proxy(node, out.tracer)
    env.symbol_placeholders[sym] = proxy
    out.inputs.append((source, _real_value(out, name), None))
    return proxy


def _real_value(out, name: str) -> int:
    """Evaluate `L['x'].size()[0]` against the real tensor the capture was given."""
    for source, real, _vt in out.inputs:
        base = source.name()
        if name.startswith(base + ".") and isinstance(real, torch.Tensor):
            return eval("___v" + name[len(base):], {"___v": real})
    raise KeyError(name)


def _build(env, expr):
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return _placeholder(env, expr)
    op = _SYMPY_OPS.get(type(expr))
    if op is not None:
        args = [_build(env, a) for a in expr.args]
        acc = args[0]
        for a in args[1:]:
            acc = op(acc, a)
        return acc
    name = type(expr).__name__
    if name == "FloorDiv":
        return _build(env, expr.args[0]) // _build(env, expr.args[1])
    if name in ("PythonMod", "Mod"):
        return _build(env, expr.args[0]) % _build(env, expr.args[1])
    if isinstance(expr, sympy.Pow) and isinstance(expr.exp, sympy.Integer) and expr.exp > 0:
        return _build(env, expr.base) ** int(expr.exp)
    raise NotImplementedError(name)


def to_proxy(value):
    """The graph value for a symbolic int (or a container of them): a placeholder for a
    plain symbol, arithmetic on placeholders for an expression. An expression we cannot
    rebuild is specialized to its current value (guarded, hence still correct)."""
    if isinstance(value, torch.SymInt):
        env, expr = _canonical(value)
        try:
            return _build(env, expr)
        except NotImplementedError:
            return int(value)  # adds a guard pinning the value
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        return float(value) if isinstance(value, torch.SymFloat) else bool(value)
    if isinstance(value, torch.Size) or type(value) is tuple:
        return tuple(to_proxy(v) for v in value)
    if type(value) is list:
        return [to_proxy(v) for v in value]
    if isinstance(value, slice):
        return slice(to_proxy(value.start), to_proxy(value.stop), to_proxy(value.step))
    return value
