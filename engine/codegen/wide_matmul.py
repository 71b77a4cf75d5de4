"""A pass over the aten graph before lowering: a 16-bit CUDA matmul whose product the graph
only returns widened to fp32 is computed in fp32, `torch.mm(a, b, out_dtype=torch.float32)`.

Under autocast every weight gradient is such a product: the backward's bf16 matmul, then a
cast to the fp32 parameter's dtype (through transposes: a Linear's weight is read
transposed). cuBLAS accumulates in fp32 either way; the pass drops the rounding to bf16, the
bf16 write, and the cast kernel that read it back and wrote fp32. On an H200 a
[5632, 2048] gradient took 104 us as matmul and cast, 74 us as one fp32 matmul (a
Llama-style ~1B training step makes 113 weight gradients this way).

The values are the fp32 accumulator's where eager's are that rounded to bf16 first: nearer
the exact product, and apart from eager's by up to half a bf16 step of each element.
`engine.config.wide_matmul = False` keeps eager's rounding."""

from __future__ import annotations

import torch
import torch.fx

aten, prims = torch.ops.aten, torch.ops.prims

# views between the matmul and the cast: moved after the wider matmul as they are
_VIEWS = (aten.permute.default, aten.t.default, aten.transpose.int, aten.slice.Tensor, aten.view.default,
          aten._unsafe_view.default)


def _widens_to_fp32(node: torch.fx.Node) -> bool:
    """node is a cast to fp32 that does nothing else (no device, layout or format change)."""
    if node.op != "call_function" or len(node.args) < 1 or not isinstance(node.args[0], torch.fx.Node):
        return False
    if node.target is prims.convert_element_type.default:
        return len(node.args) == 2 and node.args[1] is torch.float32 and not node.kwargs
    if node.target is not aten._to_copy.default or len(node.args) != 1:
        return False
    kw = dict(node.kwargs)
    src = node.args[0].meta.get("val")
    ok = (kw.pop("dtype", None) is torch.float32 and kw.pop("layout", torch.strided) in (None, torch.strided)
          and kw.pop("device", None) in (None, getattr(src, "device", None))
          and kw.pop("memory_format", None) in (None, torch.preserve_format))
    kw.pop("non_blocking", None)
    return ok and not kw


def _static(args) -> bool:
    return not any(isinstance(a, torch.fx.Node) for a in torch.utils._pytree.tree_leaves(list(args)))


def _matmul_under(cast: torch.fx.Node):
    """(the 16-bit CUDA mm the cast widens, the views between them, top down) or None: each
    used by the next alone."""
    chain, src = [], cast.args[0]
    while src.op == "call_function" and src.target in _VIEWS and len(src.users) == 1 and _static(src.args[1:]) \
            and _static(src.kwargs.values()):
        chain.append(src)
        src = src.args[0]
    if src.op != "call_function" or src.target is not aten.mm.default or len(src.users) != 1:
        return None
    fakes = [a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in src.args]
    if not all(isinstance(f, torch.Tensor) and f.device.type == "cuda" and f.dim() == 2 for f in fakes) \
            or fakes[0].dtype not in (torch.bfloat16, torch.float16) or fakes[1].dtype != fakes[0].dtype:
        return None
    return src, chain[::-1]


def widen_matmuls(gm: torch.fx.GraphModule) -> int:
    """Rewrite gm in place; returns how many matmuls now compute fp32."""
    g, count = gm.graph, 0
    for cast in list(g.nodes):
        # only a product the graph returns (a weight gradient, stored in fp32 anyway): one a
        # kernel reads is cast inside that kernel, and an fp32 product would double the bytes
        # the matmul writes and the kernel reads
        if not _widens_to_fp32(cast) or not all(u.op == "output" for u in cast.users):
            continue
        found = _matmul_under(cast)
        if found is None:
            continue
        mm, views = found
        fa, fb = (a.meta["val"] for a in mm.args)
        added = []
        with g.inserting_before(cast), fa.fake_mode:
            out = g.call_function(aten.mm.dtype, tuple(mm.args), {"out_dtype": torch.float32})
            out.meta = {**mm.meta, "val": aten.mm.dtype(fa, fb, out_dtype=torch.float32)}
            added.append(out)
            for v in views:
                new = g.call_function(v.target, (out,) + tuple(v.args[1:]), dict(v.kwargs))
                new.meta = {**v.meta, "val": v.target(out.meta["val"], *v.args[1:], **v.kwargs)}
                added.append(new)
                out = new
        want, got = cast.meta.get("val"), out.meta["val"]
        if not (isinstance(want, torch.Tensor) and want.shape == got.shape and want.stride() == got.stride()):
            for n in reversed(added):     # the cast's result has a layout the views do not give: left as it is
                g.erase_node(n)
            continue
        cast.replace_all_uses_with(out)
        for n in [cast] + views[::-1] + [mm]:
            g.erase_node(n)
        count += 1
    if count:
        gm.recompile()
    return count
