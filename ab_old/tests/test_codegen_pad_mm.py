"""16-bit CUDA matmuls with a size that is not a multiple of 8 (a vocabulary of 50257)
run on zero-padded operands: the aten graph is rewritten before lowering
(engine/codegen/pad_mm.py). Checked here on fake CUDA tensors (the rewrite only reads
metadata) and by running the rewritten graph on the CPU; tests/test_triton_gpu.py runs
it on a GPU."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from engine.codegen.pad_mm import pad_matmuls

aten = torch.ops.aten


def traced(fn, *shapes, dtype=torch.bfloat16, device="cuda"):
    with FakeTensorMode():
        args = [torch.empty(s, dtype=dtype, device=device) for s in shapes]
    return make_fx(fn, tracing_mode="fake")(*args)


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("fn,shapes,pads", [
    (torch.mm, [(64, 300), (300, 257)], [[0, 4], [0, 7, 0, 4]]),         # K and N odd
    (torch.mm, [(64, 256), (256, 50257)], [[0, 7, 0, 0]]),               # N odd: an lm head
    (torch.mm, [(64, 50257), (50257, 256)], [[0, 7], [0, 0, 0, 7]]),     # K odd: its input gradient
    (lambda b, a, w: torch.addmm(b, a, w), [(260,), (64, 256), (256, 260)], [[0, 4, 0, 0], [0, 4]]),
])
def test_odd_sizes_are_zero_padded_and_sliced_back(fn, shapes, pads):
    gm = traced(fn, *shapes)
    assert pad_matmuls(gm) == 1
    got = [list(n.args[1]) for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default]
    assert sorted(got) == sorted(pads)
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    n = shapes[-1][-1]
    if n % 8:   # the result is the first n columns of the padded product: a view
        assert out.target is aten.slice.Tensor and tuple(out.args[1:]) == (1, 0, n)
    # the rewritten graph computes what the original did (run on the CPU, in float32)
    real = [torch.randn(s) for s in shapes]
    torch.testing.assert_close(gm(*real), fn(*real), rtol=1e-4, atol=1e-3)   # sums of 50257 terms


@pytest.mark.parametrize("shapes,dtype,device", [
    ([(64, 256), (256, 512)], torch.bfloat16, "cuda"),    # aligned already
    ([(64, 100), (100, 57)], torch.bfloat16, "cuda"),     # too small to be worth a copy
    ([(64, 300), (300, 257)], torch.float32, "cuda"),     # fp32: cuBLAS has no such cliff
    ([(64, 300), (300, 257)], torch.bfloat16, "cpu"),
])
def test_other_matmuls_are_left_alone(shapes, dtype, device):
    gm = traced(torch.mm, *shapes, dtype=dtype, device=device)
    assert pad_matmuls(gm) == 0
    assert aten.constant_pad_nd.default not in targets(gm)


def test_a_linear_weight_is_padded_as_it_lies():
    """GPT-2's lm head: `x @ W.t()` with W [50257, 768]. The padded copy adds rows to W
    (reading and writing it in memory order) and the matmul reads it transposed."""
    def lm_head(x, w):
        return torch.mm(x, w.t())
    gm = traced(lm_head, (64, 256), (50257, 256))
    assert pad_matmuls(gm) == 1
    pad = next(n for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default)
    assert list(pad.args[1]) == [0, 0, 0, 7]
    assert pad.meta["val"].shape == (50264, 256) and pad.meta["val"].is_contiguous()
    mm = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    assert mm.args[1].meta["val"].stride() == (1, 256)
    real = [torch.randn(64, 256), torch.randn(50257, 256)]
    torch.testing.assert_close(gm(*real), lm_head(*real), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("input_grad_first", [True, False])
def test_a_computed_operand_is_padded_once_for_all_its_users(input_grad_first):
    """An lm head's backward: the logits gradient g feeds `g @ W` (K = 50257, padded) and
    `g.t() @ h`. Both read the one padded copy, in either order, so the kernel that
    computes g stores it once, padded."""
    def backward(logits, w, h):
        g = logits * 2
        return (g @ w, g.t() @ h) if input_grad_first else (g.t() @ h, g @ w)

    gm = traced(backward, (64, 50257), (50257, 256), (64, 256))
    assert pad_matmuls(gm) == 2
    mul = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    assert [u.target for u in mul.users] == [aten.constant_pad_nd.default]
    # `g.t() @ h` has 50257 rows: it reads all of the padded copy, transposed (its extra rows
    # are zeros), and its result is the product's first 50257 rows, a dense view
    (pad,) = mul.users
    (pt,) = [n for n in pad.users if n.target is aten.permute.default]
    assert pt.meta["val"].shape == (50264, 64)
    (mm,) = pt.users
    (rows,) = mm.users
    assert rows.target is aten.slice.Tensor and tuple(rows.args[1:]) == (0, 0, 50257)
    assert rows.meta["val"].is_contiguous()
    real = [torch.randn(64, 50257), torch.randn(50257, 256), torch.randn(64, 256)]
    for got, want in zip(gm(*real), backward(*real)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def test_an_operand_two_matmuls_pad_is_padded_once():
    def two_heads(h, w1, w2):
        g = h * 2
        return g @ w1, g @ w2

    gm = traced(two_heads, (64, 50257), (50257, 256), (50257, 128))
    assert pad_matmuls(gm) == 2
    pads_of_g = [n for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default
                 and n.args[0].target is aten.mul.Tensor]
    assert len(pads_of_g) == 1
    assert not any(n.target is aten.constant_pad_nd.default and n.args[0].target is aten.slice.Tensor
                   for n in gm.graph.nodes)
    real = [torch.randn(64, 50257), torch.randn(50257, 256), torch.randn(50257, 128)]
    for got, want in zip(gm(*real), two_heads(*real)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
