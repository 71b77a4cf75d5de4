"""Foreach ops (`aten._foreach_mul.Scalar(tensors, 0.9)`, an optimizer step's vocabulary)
as one op per tensor: the lowerings then fuse each tensor's whole update (an AdamW step
reads param, grad and both moments once and writes them once) where an extern foreach
call per line of the optimizer would make a new list of tensors each, and a copy back.

A list argument is taken element by element, anything else is shared by every element.
Ops whose per-tensor form is not a plain function of the elements (`.Tensor` overloads of
addcdiv/addcmul with a tensor of step sizes, `_foreach_mm`, `powsum`) stay whole."""

from __future__ import annotations

import torch

aten = torch.ops.aten

_UNARY = ("abs acos asin atan ceil cos cosh erf erfc exp expm1 floor frac lgamma log log10 log1p log2 neg "
          "reciprocal round rsqrt sigmoid sign sin sinh sqrt tan tanh trunc").split()


def _per_tensor(fn):
    def decomposition(*args, **kwargs):
        n = next(len(a) for a in args if isinstance(a, (list, tuple)))
        return [fn(*[a[i] if isinstance(a, (list, tuple)) else a for a in args],
                   **{k: v[i] if isinstance(v, (list, tuple)) else v for k, v in kwargs.items()})
                for i in range(n)]
    return decomposition


def _copy(self, src, non_blocking=False):
    return aten.copy.default(self, src)


def _norm(self, ord=2, dtype=None):
    return torch.linalg.vector_norm(self, ord, dtype=dtype)


def foreach_decompositions() -> dict:
    table: dict = {}

    def add(name: str, overloads, fn) -> None:
        packet = getattr(aten, f"_foreach_{name}", None)
        for o in overloads:
            op = getattr(packet, o, None) if packet is not None else None
            if op is not None:
                table[op] = _per_tensor(fn)

    for name in _UNARY:
        add(name, ["default"], getattr(torch, name))
    for name in ("add", "sub"):
        add(name, ["List", "Scalar", "ScalarList", "Tensor"], getattr(torch, name))
    for name in ("mul", "div"):
        add(name, ["List", "Scalar", "ScalarList", "Tensor"], getattr(torch, name))
    for name in ("clamp_min", "clamp_max"):
        add(name, ["List", "Scalar", "ScalarList"], getattr(torch, name))
    for name in ("maximum", "minimum"):
        add(name, ["List"], getattr(torch, name))
    add("pow", ["List", "Scalar", "ScalarList", "ScalarAndTensor"], torch.pow)
    add("lerp", ["List", "Scalar", "ScalarList"], torch.lerp)
    for name in ("addcdiv", "addcmul"):
        fn = getattr(torch, name)
        add(name, ["Scalar", "ScalarList"], lambda s, t1, t2, value=1, fn=fn: fn(s, t1, t2, value=value))
    add("clone", ["default"], torch.clone)
    add("zero", ["default"], torch.zeros_like)
    add("copy", ["default"], _copy)
    add("norm", ["Scalar"], _norm)
    add("max", ["default"], torch.amax)
    return table
