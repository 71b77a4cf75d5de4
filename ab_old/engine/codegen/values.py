"""The value IR inside a loop body: what one element of a pointwise or reduction node
computes. Values are hash-consed (one object per distinct expression, per graph) so that
emitters can common up subexpressions by identity, and are device-neutral: an emitter
(C++ today, Triton later) renders each kind.

Kinds:
  load(buf, index)         element `index` (a sympy expression) of buffer `buf`
  const(value)             a Python scalar, in `dtype`
  index(expr)              an index expression used as a value (arange, masks)
  op(name, args)           a pointwise op from OPS, result in `dtype`
  masked(mask, body, other)  `body` is evaluated only where `mask` holds (cat, pad);
                           its loads may be out of bounds elsewhere
"""

from __future__ import annotations

from typing import Any

import torch

# name -> number of args. Semantics are torch's (NaN-propagating maximum/minimum,
# Python-style floor division and remainder).
OPS = {
    "add": 2, "sub": 2, "mul": 2, "truediv": 2, "floordiv": 2, "remainder": 2, "pow": 2,
    "maximum": 2, "minimum": 2, "atan2": 2, "copysign": 2,
    "eq": 2, "ne": 2, "lt": 2, "le": 2, "gt": 2, "ge": 2,
    "logical_and": 2, "logical_or": 2, "logical_xor": 2,
    "bitwise_and": 2, "bitwise_or": 2, "bitwise_xor": 2,
    "neg": 1, "abs": 1, "exp": 1, "exp2": 1, "expm1": 1, "log": 1, "log2": 1, "log10": 1,
    "log1p": 1, "sqrt": 1, "rsqrt": 1, "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1,
    "atan": 1, "sinh": 1, "cosh": 1, "tanh": 1, "asinh": 1, "acosh": 1, "atanh": 1,
    "erf": 1, "erfc": 1, "ndtr": 1, "sigmoid": 1, "reciprocal": 1, "floor": 1, "ceil": 1, "round": 1,
    "trunc": 1, "sign": 1, "isnan": 1, "isinf": 1, "logical_not": 1, "bitwise_not": 1,
    "relu": 1, "to_dtype": 1, "where": 3, "lgamma": 1, "signbit": 1,
}


class Value:
    __slots__ = ("kind", "name", "args", "dtype", "extra", "__weakref__")

    def __init__(self, kind: str, name: str | None, args: tuple, dtype: torch.dtype, extra: Any):
        self.kind, self.name, self.args, self.dtype, self.extra = kind, name, args, dtype, extra

    def __repr__(self) -> str:
        if self.kind == "load":
            return f"load({self.name}, {self.extra})"
        if self.kind == "const":
            return f"{self.extra!r}"
        if self.kind == "index":
            return f"index({self.extra})"
        if self.kind == "iload":
            return f"load({self.name}, {self.extra[0]}, where {dict(zip(self.extra[1], self.args))})"
        if self.kind == "masked":
            return f"masked({self.args[0]!r}, {self.args[1]!r}, {self.extra!r})"
        inner = ", ".join(repr(a) for a in self.args)
        if self.name == "to_dtype":
            return f"to_dtype({inner}, {str(self.dtype).replace('torch.', '')})"
        return f"{self.name}({inner})"


_table: dict = {}


def reset() -> None:
    _table.clear()


def _make(kind, name, args, dtype, extra) -> Value:
    key = (kind, name, tuple(id(a) for a in args), dtype,
           (type(extra), repr(extra)) if kind == "const" else extra)
    v = _table.get(key)
    if v is None:
        v = Value(kind, name, tuple(args), dtype, extra)
        _table[key] = (v)
    return v


def load(buf: str, index, dtype) -> Value:
    return _make("load", buf, (), dtype, index)


def iload(buf: str, index, bindings: tuple, dtype) -> Value:
    """An indirect load: `index` contains placeholder symbols (`bindings[k][0]`) whose
    values are computed by `bindings[k][1]` (gather, embedding, index_select)."""
    syms = tuple(s for s, _ in bindings)
    return _make("iload", buf, tuple(v for _, v in bindings), dtype, (index, syms))


def const(value, dtype) -> Value:
    if dtype.is_floating_point:
        value = float(value)
    elif dtype == torch.bool:
        value = bool(value)
    else:
        value = int(value)
    return _make("const", None, (), dtype, value)


def index_value(expr, dtype=torch.int64) -> Value:
    return _make("index", None, (), dtype, expr)


def op(name: str, *args: Value, dtype) -> Value:
    assert name in OPS and OPS[name] == len(args), (name, len(args))
    return _make("op", name, args, dtype, None)


def cast(v: Value, dtype) -> Value:
    if v.dtype == dtype:
        return v
    if v.name == "to_dtype" and v.dtype == dtype:
        return v
    if dtype in (torch.bfloat16, torch.float16) and v.name == "to_dtype" and v.args[0].name == "to_dtype" \
            and v.args[0].dtype == dtype:
        return v.args[0]
    if v.kind == "const":
        return const(v.extra, dtype)
    return _make("op", "to_dtype", (v,), dtype, None)


def masked(mask: Value, body: Value, other) -> Value:
    return _make("masked", None, (mask, body), body.dtype, other)


def subs(v: Value, mapping: dict, memo=None) -> Value:
    """v with index symbols replaced (mapping: symbol -> sympy expression) in every index."""
    memo = {} if memo is None else memo
    hit = memo.get(id(v))
    if hit is not None:
        return hit
    args = tuple(subs(a, mapping, memo) for a in v.args)
    extra = v.extra
    if v.kind in ("load", "index"):
        extra = extra.subs(mapping) if hasattr(extra, "subs") else extra
    elif v.kind == "iload":
        extra = (extra[0].subs(mapping), extra[1])
    out = _make(v.kind, v.name, args, v.dtype, extra)
    memo[id(v)] = out
    return out


def through_index(v: Value, sym, value: Value, memo=None):
    """v with the index symbol `sym` taking a computed value (a gather's index): each load
    whose index uses sym becomes an indirect load bound to `value`. None where sym is used
    another way (inside an indirect load, or in an index value other than sym itself)."""
    memo = {} if memo is None else memo
    if id(v) in memo:
        return memo[id(v)]
    out = v
    if v.kind == "load":
        if sym in getattr(v.extra, "free_symbols", ()):
            out = iload(v.name, v.extra, ((sym, value),), v.dtype)
    elif v.kind == "index":
        if sym in getattr(v.extra, "free_symbols", ()):
            out = cast(value, v.dtype) if v.extra == sym else None
    elif v.kind == "iload":
        if sym in v.extra[0].free_symbols or any(through_index(a, sym, value, memo) is not a for a in v.args):
            out = None
    elif v.args:
        args = [through_index(a, sym, value, memo) for a in v.args]
        if any(a is None for a in args):
            out = None
        elif any(a is not b for a, b in zip(args, v.args)):
            out = _make(v.kind, v.name, tuple(args), v.dtype, v.extra)
    memo[id(v)] = out
    return out


def walk(v: Value, seen=None):
    """Every value reachable from v, each once, children first."""
    seen = set() if seen is None else seen
    out = []
    stack = [(v, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in seen:
            continue
        if done:
            seen.add(id(node))
            out.append(node)
            continue
        stack.append((node, True))
        for a in node.args:
            if id(a) not in seen:
                stack.append((a, False))
    return out


def loads(v: Value) -> list[Value]:
    """Every memory read in v (direct and indirect)."""
    return [x for x in walk(v) if x.kind in ("load", "iload")]


def compute_dtype(dtype):
    """bf16/f16 are computed in float32, as eager's kernels do."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
