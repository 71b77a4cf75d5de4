"""`torch._higher_order_ops.associative_scan` (transformers' Mamba calls it when compiled)
traced as the parallel prefix it computes: neighbouring pairs combined level by level,
log2(n) levels of slices, combine_fn calls and interleaves, the recursion torch's generic
implementation runs eagerly. The capture inlines this module's Python like user code
(calls.py SPECIAL_FUNCTIONS), so what combine_fn does lands in the graph.

combine_mode="pointwise" applies combine_fn to whole slices (it must be elementwise, as
torch requires); "generic" applies it through torch.vmap over the scan dim."""

from __future__ import annotations

import torch


def associative_scan(combine_fn, xs, dim, reverse=False, combine_mode="pointwise"):
    single = isinstance(xs, torch.Tensor)
    leaves = [xs] if single else list(xs)
    leaves = [torch.movedim(x, dim, 0) for x in leaves]
    if reverse:
        leaves = [torch.flip(x, [0]) for x in leaves]
    fn = combine_fn if combine_mode == "pointwise" else torch.vmap(combine_fn)

    def combine(left, right):
        out = fn(left[0], right[0]) if single else fn(tuple(left), tuple(right))
        return [out] if single else list(out)

    out = _scan(combine, leaves)
    if reverse:
        out = [torch.flip(x, [0]) for x in out]
    out = [torch.movedim(x, 0, dim) for x in out]
    return out[0] if single else type(xs)(out)


def _scan(combine, elems):
    n = elems[0].shape[0]
    if n < 2:
        return elems
    odd = _scan(combine, combine([e[0:-1:2] for e in elems], [e[1::2] for e in elems]))
    if n % 2 == 0:
        even = combine([o[:-1] for o in odd], [e[2::2] for e in elems])
    else:
        even = combine(odd, [e[2::2] for e in elems])
    even = [torch.cat([e[0:1], r], dim=0) for e, r in zip(elems, even)]
    return [_interleave(a, b) for a, b in zip(even, odd)]


def _interleave(a, b):
    """a[0], b[0], a[1], b[1], ... along dim 0 (a has as many rows as b, or one more)."""
    if a.shape[0] == b.shape[0]:
        return torch.stack([a, b], dim=1).flatten(0, 1)
    return torch.cat([torch.stack([a[:-1], b], dim=1).flatten(0, 1), a[-1:]], dim=0)
