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
    found = getattr(out, "unbacked_sizes", {}).get(sym)
    if found is not None:   # a data-dependent size: read from the tensor that has it
        tensor, index, dim, value = found
        # read right where the tensor is made: a later in-place op can move the dim
        # (`t = y[mask]; t.transpose_(0, 1)` then `t.shape[-1]`: fuzz 328441)
        at = tensor.node
        if index is not None:
            with out.graph.inserting_after(at):
                tensor = tensor[index]
            at = tensor.node
        with out.graph.inserting_after(at):
            proxy = out.tracer.create_proxy("call_function", torch.ops.aten.sym_size.int, (tensor, dim), {})
        proxy.node.meta["example_value"] = value
        proxy.node.meta["val"] = value
        env.symbol_placeholders[sym] = proxy
        return proxy
    if sym not in symbol_names(env):
        raise NotImplementedError(f"no graph value computes the symbol {sym}")
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
    out.inputs.append((source, hint, None))  # the value the capture saw: the backend's example input
    return proxy


_RELATIONS = {sympy.StrictGreaterThan: operator.gt, sympy.GreaterThan: operator.ge,
              sympy.StrictLessThan: operator.lt, sympy.LessThan: operator.le,
              sympy.Eq: operator.eq, sympy.Ne: operator.ne}


def build_graph_expr(env, expr, numbers: bool = False):
    """Graph arithmetic computing the sympy `expr`, each symbol read from its placeholder
    (a backed size: a new graph input). Sizes need integer arithmetic only; numbers=True
    (captured scalars) also rebuilds bools, floats, comparisons, negative powers, true
    division and ToFloat. Raises NotImplementedError for anything else."""
    if numbers and (expr is sympy.true or expr is sympy.false):
        return bool(expr)
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if numbers and isinstance(expr, (sympy.Rational, sympy.Float)):
        return float(expr)
    if isinstance(expr, sympy.Symbol):
        return _placeholder(env, expr)
    op = _SYMPY_OPS.get(type(expr))
    if op is not None:
        args = [build_graph_expr(env, a, numbers) for a in expr.args]
        acc = args[0]
        for a in args[1:]:
            acc = op(acc, a)
        return acc
    rel = _RELATIONS.get(type(expr)) if numbers else None
    if rel is not None:
        return rel(build_graph_expr(env, expr.lhs, numbers), build_graph_expr(env, expr.rhs, numbers))
    if isinstance(expr, sympy.Pow) and isinstance(expr.exp, sympy.Integer) and (numbers or expr.exp > 0):
        e = int(expr.exp)
        base = build_graph_expr(env, expr.base, numbers)
        return base ** e if e > 0 else 1.0 / (base ** -e)
    name = type(expr).__name__
    if numbers and name == "ToFloat":
        return torch.sym_float(build_graph_expr(env, expr.args[0], numbers))
    if name == "FloorDiv" or (numbers and name in ("IntTrueDiv", "FloatTrueDiv")):
        f = operator.floordiv if name == "FloorDiv" else operator.truediv
        return f(build_graph_expr(env, expr.args[0], numbers), build_graph_expr(env, expr.args[1], numbers))
    if name in ("PythonMod", "Mod"):
        return build_graph_expr(env, expr.args[0], numbers) % build_graph_expr(env, expr.args[1], numbers)
    raise NotImplementedError(name)


def to_proxy(value):
    """The graph value for a symbolic int (or a container of them): a placeholder for a
    plain symbol, arithmetic on placeholders for an expression. An expression we cannot
    rebuild is specialized to its current value (guarded, hence still correct)."""
    if isinstance(value, torch.SymInt):
        env, expr = _canonical(value)
        try:
            return build_graph_expr(env, expr)
        except NotImplementedError:
            return int(value)  # adds a guard pinning the value
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        return float(value) if isinstance(value, torch.SymFloat) else bool(value)
    return map_items(to_proxy, value)


def map_items(fn, value):
    """`fn` over the items of a size, tuple, list or slice (giving a tuple, list or slice);
    any other value as it is."""
    if isinstance(value, torch.Size) or type(value) is tuple:
        return tuple(fn(v) for v in value)
    if type(value) is list:
        return [fn(v) for v in value]
    if isinstance(value, slice):
        return slice(fn(value.start), fn(value.stop), fn(value.step))
    return value


# Functions whose result is text (or an identity) built from the value: on a symbol they
# would see "s0", not the size. Their arguments are specialized first (a guard pins them).
TEXT_FUNCTIONS = {str, repr, format, ascii, hash, id, chr, hex, oct, bin}


def specialize(value):
    """`value` with every symbolic int/float/bool replaced by its current value; each one
    adds a guard, so the entry is only used when the sizes are those again."""
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    if isinstance(value, torch.SymBool):
        return bool(value)
    if isinstance(value, torch.Size):
        return torch.Size([specialize(v) for v in value])
    if type(value) in (tuple, list):
        return type(value)(specialize(v) for v in value)
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return type(value)(*(specialize(v) for v in value))
    if isinstance(value, dict):
        return {k: specialize(v) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(specialize(value.start), specialize(value.stop), specialize(value.step))
    return value


def needs_specializing(fn, args, kwargs=None) -> bool:
    """Would calling `fn` at trace time turn a symbol into text?"""
    if not (any(_deep_symbolic(a) for a in args) or (kwargs and any(_deep_symbolic(v) for v in kwargs.values()))):
        return False
    if fn in TEXT_FUNCTIONS:
        return True
    owner = getattr(fn, "__self__", None)
    return isinstance(owner, (str, bytes)) or getattr(fn, "__objclass__", None) in (str, bytes) or (
        fn is operator.mod and args and isinstance(args[0], (str, bytes)))


def _deep_symbolic(v) -> bool:
    if has_symbolic(v):
        return True
    if isinstance(v, dict):
        return any(_deep_symbolic(x) for x in v.values())
    if isinstance(v, tuple):
        return any(_deep_symbolic(x) for x in v)
    return False


# Functions that only look at the type: a symbolic int is an int to them (no guard needed).
TYPE_FUNCTIONS = {isinstance, type, callable}


def as_plain_types(value):
    """`value` with each symbolic number replaced by its current value, without a guard:
    only for calls that look at nothing but the type."""
    if isinstance(value, SYM_TYPES):
        hint = value.node.hint
        if hint is None:
            return specialize(value)
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)](hint)
    if type(value) in (tuple, list):
        return type(value)(as_plain_types(v) for v in value)
    return value
