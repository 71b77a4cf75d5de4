"""A 16-bit CUDA matmul whose product the graph returns cast to fp32 (autocast's weight
gradients) computes fp32 directly: the aten graph is rewritten before lowering
(engine/codegen/wide_matmul.py). Checked here on fake CUDA tensors (the rewrite reads only
metadata; the CPU has no fp32-output matmul to run it with); tests/test_triton_gpu.py runs
a training step through it on a GPU against eager."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from engine.codegen.wide_matmul import widen_matmuls

aten = torch.ops.aten


def traced(fn, *shapes, dtype=torch.bfloat16, device="cuda"):
    with FakeTensorMode():
        args = [torch.empty(s, dtype=dtype, device=device) for s in shapes]
    return make_fx(fn, tracing_mode="fake")(*args)


def sliced_then_widened(rows: slice, cols: slice):
    """mm(g.t(), x)[rows, cols].float(), the slice and the cast added to the traced graph by
    hand (a slice of a fake CUDA tensor does not trace on a CPU-only torch)."""
    gm = traced(lambda g, x: (torch.mm(g.t(), x),), (64, 32), (64, 48))
    out = next(n for n in gm.graph.nodes if n.op == "output")
    node = out.args[0][0]
    steps = [(aten.slice.Tensor, (0, rows.start or 0, rows.stop or 32)),
             (aten.slice.Tensor, (1, cols.start or 0, cols.stop or 48))]
    with gm.graph.inserting_before(out), node.meta["val"].fake_mode:
        for target, args in steps:
            new = gm.graph.call_function(target, (node,) + args)
            new.meta = {"val": target(node.meta["val"], *args)}
            node = new
        cast = gm.graph.call_function(aten._to_copy.default, (node,), {"dtype": torch.float32})
        cast.meta = {"val": aten._to_copy.default(node.meta["val"], dtype=torch.float32)}
    out.args = ((cast,),)
    gm.recompile()
    return gm


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def output_meta(gm):
    return next(n for n in gm.graph.nodes if n.op == "output").args[0][0].meta["val"]


@pytest.mark.parametrize("fn", [
    # a Linear's weight gradient as AOT autograd writes it: the product of the transposed
    # output gradient and the input, transposed twice, then widened to the parameter's fp32
    lambda g, x: (torch.mm(g.t(), x).t().t().float(),),
    lambda g, x: (torch.mm(g.t(), x).to(torch.float32),),
    lambda g, x: (torch.mm(g.t(), x).t().float(),),       # handed over transposed: the same strides
    "rows",     # a slice of the product's rows (a padded vocabulary's gradient), then the cast
])
def test_a_product_only_widened_is_computed_in_fp32(fn):
    if fn == "rows":
        gm = sliced_then_widened(slice(0, 16), slice(None))
    else:
        gm = traced(fn, (64, 32), (64, 48))
    before = output_meta(gm)
    assert widen_matmuls(gm) == 1
    ts = targets(gm)
    assert aten.mm.dtype in ts and aten.mm.default not in ts
    assert aten._to_copy.default not in ts and torch.ops.prims.convert_element_type.default not in ts
    mm = next(n for n in gm.graph.nodes if n.target is aten.mm.dtype)
    assert mm.kwargs == {"out_dtype": torch.float32}
    after = output_meta(gm)
    # what the graph returns has the cast's dtype, shape and strides
    assert (after.dtype, after.shape, after.stride()) == (torch.float32, before.shape, before.stride())


@pytest.mark.parametrize("fn,dtype,device", [
    (lambda g, x: (torch.mm(g.t(), x).float(), torch.mm(g.t(), x).sum()), torch.bfloat16, "cpu"),  # no CPU kernel
    (lambda g, x: (torch.mm(g.t(), x).double(),), torch.bfloat16, "cuda"),     # not to fp32
    (lambda g, x: (torch.mm(g.t(), x).float(),), torch.float32, "cuda"),       # fp32 already
    (lambda g, x: (torch.mm(g.t(), x).half(),), torch.bfloat16, "cuda"),
])
def test_other_casts_are_left_alone(fn, dtype, device):
    gm = traced(fn, (64, 32), (64, 48), dtype=dtype, device=device)
    assert widen_matmuls(gm) == 0
    assert aten.mm.dtype not in targets(gm)


def test_a_product_also_used_in_16_bits_is_left_alone():
    """The bf16 product is read by something else too (here a sum): it is computed as eager
    computes it, and the cast stays a cast of it."""
    def fn(g, x):
        p = torch.mm(g.t(), x)
        return p.float(), p.sum()
    gm = traced(fn, (64, 32), (64, 48))
    assert widen_matmuls(gm) == 0
    assert aten._to_copy.default in targets(gm)


def test_a_cast_whose_layout_the_views_do_not_give_is_left_alone():
    """Columns sliced off the product are not dense: the cast writes them contiguous, which
    the slice of an fp32 product would not be."""
    gm = sliced_then_widened(slice(None), slice(0, 5))
    assert widen_matmuls(gm) == 0
    assert aten.mm.default in targets(gm) and aten.mm.dtype not in targets(gm)


def test_a_widened_product_a_kernel_reads_stays_16_bits():
    """An input gradient widened on its way into fp32 math (SiLU's backward): the cast is
    fused into that kernel, so an fp32 product would only double the bytes moved."""
    gm = traced(lambda g, w, h: (torch.mm(g, w).float() * torch.sigmoid(h.float()),), (64, 32), (32, 48), (64, 48))
    assert widen_matmuls(gm) == 0
    assert aten.mm.default in targets(gm) and aten.mm.dtype not in targets(gm)
