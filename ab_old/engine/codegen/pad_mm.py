"""A pass over the aten graph before lowering: 16-bit CUDA matmuls whose inner (K) or output
(N) size is not a multiple of 8 (a vocabulary of 50257 or 30522) are computed on operands
zero-padded to one, and the result sliced back. cuBLAS takes its unaligned kernels for
such sizes, several times slower (GPT-2's logits and their gradient: 5 ms of an H100
training step); the padding copies are pointwise kernels of our own, and the slice is a
view (the padded rows' memory, as the layout of what reads it). A Linear's weight, which
the matmul reads transposed, is padded in its own layout (rows added, a coalesced copy)
and handed over transposed again.

Zero padding keeps the values exact: padded K terms add 0 * 0, padded N columns are never
read."""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten

_MIN = 256      # smaller matrices are not worth a copy


def _pad(n: int) -> int:
    return (-n) % 8 if n >= _MIN else 0


def _padded_once(g: torch.fx.Graph, a: torch.fx.Node, fa, k: int, pk: int, meta: dict) -> torch.fx.Node:
    """a with pk zero columns added. Where a is computed in this graph, its other users read
    the padded tensor's first k columns instead (the same values): a is then stored once,
    padded, in the kernel that computes it. GPT-2's logits gradient was written three times
    (as computed, padded for one backward matmul, with aligned rows for the other)."""
    if a.target is aten.slice.Tensor and tuple(a.args[1:]) == (1, 0, k) \
            and a.args[0].target is aten.constant_pad_nd.default and list(a.args[0].args[1]) == [0, pk]:
        return a.args[0]      # already padded for another matmul
    with g.inserting_after(a):
        padded = g.call_function(aten.constant_pad_nd.default, (a, [0, pk], 0.0))
    padded.meta = {**meta, "val": aten.constant_pad_nd(fa, [0, pk])}
    if a.op != "call_function":
        return padded
    others = [u for u in a.users if u is not padded and u.op == "call_function"]
    if others:
        with g.inserting_after(padded):
            first = g.call_function(aten.slice.Tensor, (padded, 1, 0, k))
        first.meta = {**a.meta, "val": aten.slice(padded.meta["val"], 1, 0, k)}
        for u in others:
            u.replace_input_with(a, first)
            _restride_views(u)
    return padded


def _restride_views(node: torch.fx.Node) -> None:
    """A view now taken of the padded tensor's columns has its rows' stride: its meta value
    says so, so that a matmul reading it is handed the view, not a copy in eager's strides."""
    t = node.target
    if not (isinstance(t, torch._ops.OpOverload) and t.is_view and isinstance(node.meta.get("val"), torch.Tensor)):
        return
    fakes = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
    with node.meta["val"].fake_mode:
        node.meta["val"] = t(*fakes, **node.kwargs)
    for u in node.users:
        _restride_views(u)


def pad_matmuls(gm: torch.fx.GraphModule) -> int:
    """Rewrite gm in place; returns how many matmuls it padded."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        if node.target is aten.addmm.default:
            if node.kwargs or len(node.args) != 3:       # beta/alpha given: leave it
                continue
            bias, a, b = node.args
        else:
            bias, (a, b) = None, node.args
        fa, fb = (x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in (a, b))
        if not all(isinstance(f, torch.Tensor) and f.device.type == "cuda" and f.dtype in (torch.bfloat16, torch.float16)
                   and f.dim() == 2 and all(isinstance(s, int) for s in f.shape) for f in (fa, fb)):
            continue
        k, n = fa.shape[1], fb.shape[1]
        pk, pn = _pad(k), _pad(n)
        fbias = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
        if bias is not None and pn and not (isinstance(fbias, torch.Tensor) and tuple(fbias.shape) == (n,)):
            continue
        if not (pk or pn):
            continue
        g = gm.graph
        with g.inserting_before(node), fa.fake_mode:
            def call(target, args, val):
                new = g.call_function(target, args)
                new.meta = {**node.meta, "val": val}
                return new
            a2 = _padded_once(g, a, fa, k, pk, node.meta) if pk else a
            if fb.stride() == (1, fb.shape[0]):   # a Linear's weight, transposed: padded as it lies
                bt = call(aten.permute.default, (b, [1, 0]), aten.permute(fb, [1, 0]))
                bt = call(aten.constant_pad_nd.default, (bt, [0, pk, 0, pn], 0.0),
                          aten.constant_pad_nd(bt.meta["val"], [0, pk, 0, pn]))
                b2 = call(aten.permute.default, (bt, [1, 0]), aten.permute(bt.meta["val"], [1, 0]))
            else:
                b2 = call(aten.constant_pad_nd.default, (b, [0, pn, 0, pk], 0.0),
                          aten.constant_pad_nd(fb, [0, pn, 0, pk]))
            fa2, fb2 = a2.meta["val"] if pk else fa, b2.meta["val"]
            if bias is None:
                out = call(aten.mm.default, (a2, b2), aten.mm(fa2, fb2))
            else:
                bias2 = call(aten.constant_pad_nd.default, (bias, [0, pn], 0.0),
                             aten.constant_pad_nd(fbias, [0, pn])) if pn else bias
                out = call(aten.addmm.default, (bias2, a2, b2), aten.addmm(bias2.meta["val"] if pn else fbias, fa2, fb2))
            if pn:
                out = call(aten.slice.Tensor, (out, 1, 0, n), aten.slice(out.meta["val"], 1, 0, n))
        node.replace_all_uses_with(out)
        g.erase_node(node)
        count += 1
    count += _pad_rows_already_padded(gm)
    if count:
        gm.recompile()
    return count


_TRANSPOSES = (aten.t.default, aten.permute.default, aten.transpose.int)


def _pad_rows_already_padded(gm: torch.fx.GraphModule) -> int:
    """`g.t() @ h` with M = 50257 rows, where g is the first 50257 columns of a zero-padded
    P (an lm head's weight gradient, after the input gradient's matmul padded g): the
    matmul reads all of P.t() instead, whose extra rows are zeros, and its result is the
    first M rows of the product, a dense view. cuBLAS took a slower kernel for the odd M
    (0.64 ms a GPT-2 step against 0.41 for torch.compile's, which pads M too)."""
    count = 0
    g = gm.graph
    for node in list(g.nodes):
        if node.op != "call_function" or node.target is not aten.mm.default:
            continue
        a, b = node.args
        fa = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if not (isinstance(fa, torch.Tensor) and fa.device.type == "cuda" and fa.dim() == 2
                and isinstance(fa.shape[0], int) and _pad(fa.shape[0])):
            continue
        m = fa.shape[0]
        if a.target not in _TRANSPOSES or a.target is aten.permute.default and list(a.args[1]) != [1, 0]:
            continue
        first = a.args[0]
        if not (isinstance(first, torch.fx.Node) and first.target is aten.slice.Tensor
                and tuple(first.args[1:]) == (1, 0, m)):
            continue
        padded = first.args[0]
        if not (padded.target is aten.constant_pad_nd.default and list(padded.args[1]) == [0, _pad(m)]
                and padded.args[2:] in ((), (0,), (0.0,))):
            continue
        fp = padded.meta["val"]
        with g.inserting_before(node), fp.fake_mode:
            pt = g.call_function(aten.permute.default, (padded, [1, 0]))
            pt.meta = {**a.meta, "val": aten.permute(fp, [1, 0])}
            prod = g.call_function(aten.mm.default, (pt, b))
            prod.meta = {**node.meta, "val": aten.mm(pt.meta["val"], b.meta["val"])}
            out = g.call_function(aten.slice.Tensor, (prod, 0, 0, m))
            out.meta = {**node.meta, "val": aten.slice(prod.meta["val"], 0, 0, m)}
        node.replace_all_uses_with(out)
        g.erase_node(node)
        for dead in (a, first):
            if not dead.users:
                g.erase_node(dead)
        count += 1
    return count
