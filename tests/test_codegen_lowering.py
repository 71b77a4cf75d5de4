"""Lowerings vs eager: each aten op family compiled by engine.codegen into C++ kernels
must give eager's results, for contiguous, strided and broadcast inputs and every dtype
we emit. One graph per test keeps g++ invocations (one per graph) few."""

import logging

import pytest
import torch
import torch.nn.functional as F

import engine
import observe
from codegen_helpers import check, compile_graph
from engine_helpers import logs

torch.manual_seed(0)
X = torch.randn(6, 10)
Y = torch.randn(10)
Z = torch.randn(6, 1)
I = torch.randint(-5, 5, (6, 10))


def test_unary_math_and_activations():
    fns = (torch.exp, torch.log, torch.abs, torch.sqrt, torch.rsqrt, torch.sin, torch.cos, torch.tanh,
           torch.sigmoid, torch.erf, torch.neg, torch.floor, torch.ceil, torch.round, torch.trunc, torch.sign,
           torch.log1p, torch.expm1, torch.reciprocal, torch.relu, torch.isnan, F.gelu, F.silu, F.softplus,
           F.elu, F.leaky_relu, F.hardswish, F.mish, lambda t: F.gelu(t, approximate="tanh"))
    c = check(lambda x: [f(x) for f in fns], X, rtol=1e-5, atol=1e-5)
    assert c.n_kernels == 1 and c.n_externs == 0   # all of it is one fused pointwise kernel


def test_binary_broadcast_and_scalars():
    check(lambda x, y, z: [x + y, x - z, x * y, x / z, torch.maximum(x, y), torch.minimum(x, z), x ** 2,
                           x.pow(y), torch.atan2(x, y), x > y, x <= z, x == y, torch.where(x > 0, x, y),
                           x.clamp(-0.5, 0.5), torch.remainder(x, 0.3), x // 0.7, x + 1, 2 - x, x.add(y, alpha=3)],
          X, Y, Z)


def test_nan_propagates_like_eager():
    x = torch.tensor([[1.0, float("nan"), -2.0], [0.5, 0.25, float("inf")]])
    check(lambda x: [torch.relu(x), torch.maximum(x, torch.zeros(3)), x.amax(1), x.argmax(1), x.clamp(min=0)], x)


def test_integer_and_bool_ops():
    b = X > 0
    check(lambda i: [i + 1, i * 3, i // 3, i % 3, i.abs(), -i, i.sum(), i.sum(1), i.float() / 2, i.max(),
                     (i > 0).sum(1), i.amax(0), i / 2, i.to(torch.int32) + 1], I)
    check(lambda b, x: [b & (x > 0.5), ~b, b.any(1), b.all(), torch.where(b, 1.0, 0.0), b.sum(), b.float().mean()],
          b, X)


@pytest.mark.parametrize("shape,dims", [((6, 10), (1,)), ((6, 10), (0,)), ((2, 3, 4), (0, 2)), ((2, 3, 4), (1,))])
def test_reductions_over_dims(shape, dims):
    x = torch.randn(shape)
    check(lambda x: [x.sum(dims), x.mean(dims, keepdim=True), x.amax(dims), x.amin(dims), x.var(dims),
                     x.std(dims, keepdim=True), x.prod(dims[0]), x.argmax(dims[0]), x.argmin(dims[-1]), x.sum()],
          x, rtol=1e-4, atol=1e-5)


def test_reduction_family():
    check(lambda x: [x.max(1), x.min(0), x.argmax(), torch.logsumexp(x, 1), x.norm(dim=1), torch.softmax(x, -1),
                     torch.log_softmax(x, 0)], X, rtol=1e-4, atol=1e-5)


def test_views_are_index_rewrites():
    c = check(lambda x: [x.t() + 1, x.view(2, 3, 10).permute(2, 0, 1) * 2, x[1:4, ::2] - 1, x[:, 3] * 1,
                         x.reshape(60)[5:20] + 0, x.unsqueeze(1).expand(6, 3, 10) + 0, x.t().contiguous(),
                         x.t().reshape(60) * 1, x.flatten()[::7] * 3], X)
    assert c.n_externs == 0


def test_views_returned_alias_their_base():
    x = X.clone()
    c = compile_graph(lambda x: [x.t(), x[1:3], x.view(60)], x)
    outs = c(x)
    assert all(o.data_ptr() >= x.data_ptr() and o.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
               for o in outs)
    assert torch.equal(outs[0], x.t())


def test_noncontiguous_and_offset_inputs():
    base = torch.randn(10, 8)
    for a in (base.t(), base[2:8, 1:7], base[:, ::2]):
        check(lambda a: [a * 2, a.sum(0), a.softmax(1), a + a.mean()], a, rtol=1e-5, atol=1e-5)


def test_cat_pad_stack():
    check(lambda x, y: [torch.cat([x, x * 2], 0), torch.cat([x, x + 1, x.exp()], 1), F.pad(x, (1, 2)),
                        F.pad(x, (2, 0, 1, 1), value=3.0), torch.stack([y, y * 2])], X, Y)


def test_factories():
    check(lambda x: [x + torch.arange(10), torch.ones(3, 4) * 2, torch.zeros_like(x) + 1, torch.full((2,), 7),
                     torch.arange(0, 10, 3), torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)], X)


def test_casts_and_low_precision():
    # bf16/f16 results are rounded after every op, as eager does
    check(lambda x: [x.double() * 2, x.to(torch.int64), x.bfloat16() * 2, x.half() + 1, (x.bfloat16() * 3).float(),
                     x.bfloat16().sum(1)], X, rtol=1e-3, atol=1e-3)
    check(lambda a: [F.layer_norm(a, (10,)), a * a, a.softmax(-1)], X.bfloat16(), rtol=2e-2, atol=2e-2)
    check(lambda a: [a.softmax(1), a.sum(0) * 2, a.var(1)], X.double(), rtol=1e-10, atol=1e-10)


def test_norms_and_losses():
    check(lambda x, w, b: F.layer_norm(x, (10,), w, b), X, torch.randn(10), torch.randn(10), rtol=1e-4, atol=1e-5)
    check(lambda a, w: a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6) * w, X, torch.randn(10), rtol=1e-4)
    bn = (torch.randn(2, 3, 4, 4), torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3))
    check(lambda a, m, v, w, b: F.batch_norm(a, m, v, w, b, training=False), *bn, rtol=1e-4, atol=1e-5)
    t = torch.randn(6, 10)
    check(lambda a, t: [F.mse_loss(a, t), F.smooth_l1_loss(a, t), (a.masked_fill(t > 0, float("-inf"))).softmax(-1)],
          X, t, rtol=1e-4, atol=1e-5)


def test_unlowered_op_runs_as_extern_and_is_a_perf_hint():
    hints = []
    fn = observe.subscribe(lambda e: hints.append(e.payload()), logs=["perf_hints"])
    try:
        c = check(lambda a: torch.cumsum(a, 1) + 1, torch.randn(2, 8))
    finally:
        observe.unsubscribe(fn)
    assert "aten.cumsum.default" in c.fallback_ops
    assert any("cumsum" in h and "extern" in h for h in hints)


def test_matmul_and_conv_are_extern_kernels_with_fused_epilogues():
    c = check(lambda x, w, b: torch.relu(F.linear(x, w, b)) * 2, X, torch.randn(5, 10), torch.randn(5))
    assert c.extern_ops == ["aten.mm.default"] and c.n_kernels == 1
    c = check(lambda a, w: F.relu(F.conv2d(a, w, padding=1)), torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3),
              rtol=1e-4, atol=1e-5)
    assert c.extern_ops == ["aten.convolution.default"] and c.fallback_ops == []


def test_a_check_that_returns_nothing_compiles_and_still_raises():
    # F.one_hot decomposes to two aten._assert_async.msg checks of its class values (no result,
    # so no metadata): switch_transformers' router takes it in every training step
    one_hot = engine.compile(lambda i: F.one_hot(i, num_classes=4) * 2, backend="inductor")
    with logs("inductor") as shown:
        assert torch.equal(one_hot(torch.tensor([1, 3, 0])), F.one_hot(torch.tensor([1, 3, 0]), 4) * 2)
    assert not [m for m in shown if "could not compile" in m], shown
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
        one_hot(torch.tensor([1, 5, 0]))


def test_graph_codegen_cannot_handle_runs_uncompiled():
    logs = []
    fn = observe.subscribe(lambda e: logs.append(e), logs=["inductor"])
    try:
        c = check(lambda a: torch.fft.fft(a).abs(), torch.randn(8), allow_fallback=True)
    finally:
        observe.unsubscribe(fn)
    assert c.n_externs >= 1 or c.fallback_reason is not None


def test_dynamic_shapes_pass_sizes_as_kernel_arguments():
    from torch.fx.experimental.proxy_tensor import make_fx
    from engine.codegen import compile_fx_graph, decomposition_table

    def f(x, w):
        return torch.softmax(x * 2, -1).sum(0) + F.layer_norm(x, (x.shape[-1],)).mean(0) * w
    gm = make_fx(f, decomposition_table=decomposition_table(), tracing_mode="symbolic")(X, Y)
    c = compile_fx_graph(gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"])
    assert c.fallback_reason is None
    for rows, cols in [(5, 7), (3, 9), (8, 16)]:      # one compiled graph, any size
        x, w = torch.randn(rows, cols), torch.randn(cols)
        torch.testing.assert_close(c(x, w), f(x, w), rtol=1e-4, atol=1e-5)
    assert "int64_t s" in c.source and "= arg0.size(0)" in c.source


def test_outputs_that_are_new_tensors_in_eager_never_alias_an_input():
    # clone, diag, stack of one tensor, repeat: the lowering reads the input in place, but
    # eager returns new memory, which the caller may write to
    import engine
    for fn in (lambda x: torch.clone(x), lambda x: torch.diag(x), lambda x: torch.stack([x], 0),
               lambda x: x.repeat(1, 1), lambda x: (x, x.t().clone())):
        x = torch.randn(4, 4)
        engine.reset()
        out = engine.compile(fn, backend="inductor")(x)
        last = out[-1] if isinstance(out, tuple) else out
        assert last.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        torch.testing.assert_close(out, fn(x))


def test_extern_arguments_have_eager_strides():
    # embedding_bag's kernel needs contiguous indices: AOT clones them; the clone is a copy here too
    import engine
    w, off, psw = torch.randn(10, 5), torch.tensor([0, 2]), torch.randn(5)
    idx = torch.randint(0, 10, (10,))[::2]

    def f(w, i, o, p):
        return torch.nn.functional.embedding_bag(i, w, o, mode="sum", per_sample_weights=p)

    engine.reset()
    torch.testing.assert_close(engine.compile(f, backend="inductor")(w, idx, off, psw), f(w, idx, off, psw))


@pytest.mark.parametrize("make", [lambda: torch.randn(6, 4), lambda: torch.randn(4, 6).t(), lambda: torch.randn(6, 8)[:, ::2]],
                         ids=["contiguous", "transposed", "strided"])
def test_foreach_results_feed_fused_kernels_in_their_real_layout(make):
    # an optimizer step's foreach ops run as aten calls; their results are read by our kernels
    a, b = make(), torch.randn(6, 4)

    def fn(a, b):
        x, y = torch._foreach_mul([a, b], 2.0)
        return (x + 1).sin(), (y * x).cos()

    check(fn, a, b)


@pytest.mark.parametrize("dim", [0, -1, (0,)])
def test_mean_of_a_0d_tensor_over_its_only_dim(dim):
    check(lambda x: torch.mean(x, dim=dim, keepdim=True) + x.mean(dim), torch.tensor(-8.5))


def test_a_buffer_returned_with_its_only_element_as_a_0d_view():
    # `w2, w2[0]`: the element is returned as a view of the buffer with no sizes (found by
    # the fuzzer: the wrapper wrote `buf.view()`, which torch refuses)
    def f(w, y):
        w2 = w * 0.9 + y.mean()
        return w2, w2[0], y * w2

    w, y = torch.randn(1), torch.randn(2, 3)
    got = engine.compile(f, backend="inductor")(w, y)
    for a, b in zip(got, f(w, y)):
        torch.testing.assert_close(a, b)
    assert got[1].shape == () and got[1]._base is got[0]        # a view, as eager's is


@pytest.mark.parametrize("read", ["gather", "index", "index_select", "embedding"])
def test_data_dependent_reads_of_a_computed_value_name_one_buffer(read):
    """A gathered value that is not in memory yet (a cross-entropy's log-softmax) is
    realized once, when lowered: evaluating the kernel body again (the scheduler does, per
    kernel it tries) reads that same buffer and adds none. A GPT-2 training forward ran
    uncompiled ("kernel0 reads buf101 before kernel31 writes it") when each evaluation
    realized a new one."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from engine.codegen import decomposition_table
    from engine.codegen.graph import GraphLowering
    from engine.codegen.ir import ComputedBuffer

    x, t = torch.randn(4, 6), torch.randint(0, 4, (4, 1))
    fn = {"gather": lambda x, t: torch.gather(x.log_softmax(-1) * 2, 1, t),
          "index": lambda x, t: (x * 2)[t[:, 0]],
          "index_select": lambda x, t: torch.index_select(x.exp(), 0, t[:, 0]),
          "embedding": lambda x, t: F.embedding(t, x.sin())}[read]
    gm = make_fx(fn, decomposition_table=decomposition_table())(x, t)
    g = GraphLowering(gm, [x, t]).run()
    bufs = [n for n in g.nodes if isinstance(n, ComputedBuffer)]
    count = len(g.nodes)
    first = [n.reads() for n in bufs]
    assert [n.reads() for n in bufs] == first
    assert len(g.nodes) == count      # no buffer added by evaluating a body
    names = {n.name for n in bufs} | {b.name for b in g.inputs if b is not None}
    assert set().union(*first) <= names
    check(fn, x, t)


def test_a_loss_reads_one_logit_a_row_and_never_writes_the_log_softmax():
    """cross_entropy = -log_softmax(x).gather(1, t): the gather reads x where t points and
    computes the log-softmax there, so the [tokens, vocabulary] matrix is never written."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from engine.codegen import decomposition_table
    from engine.codegen.graph import GraphLowering
    from engine.codegen.ir import ComputedBuffer

    x, t = torch.randn(5, 7), torch.tensor([0, 6, 3, -100, 2])
    for fn in (lambda x, t: F.cross_entropy(x, t), lambda x, t: F.cross_entropy(x, t, reduction="none"),
               lambda x, t: torch.gather(x.log_softmax(-1), 1, t.clamp(min=0)[:, None])):
        check(fn, x, t)
        gm = make_fx(fn, decomposition_table=decomposition_table())(x, t)
        g = GraphLowering(gm, [x, t]).run()
        assert not [n.name for n in g.nodes if isinstance(n, ComputedBuffer) and list(n.data.ranges) == [5, 7]]


def test_scatter_of_one_element_a_row_is_a_pointwise_select():
    """The one-hot of a loss's backward (`zeros.scatter(1, t[:, None], -1.0)`) is computed
    where it is read; other scatters stay aten calls. Both give eager's result."""
    x = torch.randn(5, 7)
    t = torch.tensor([[0], [6], [3], [3], [2]])
    src = torch.randn(5, 1)
    c = check(lambda x, t, s: [torch.zeros(5, 7).scatter(1, t, -1.0) * x, x.scatter(1, t, s),
                               x.t().scatter(0, t.t(), 2.5)], x, t, src)
    assert c.n_externs == 0, c.extern_ops
    two = torch.tensor([[0, 1], [6, 5], [3, 3], [3, 0], [2, 6]])
    part = torch.tensor([[1], [2]])            # covers only the first two rows
    c = check(lambda x, i, p: [x.scatter(1, i, 1.5), x.scatter(1, p, -2.0)], x, two, part)
    assert c.n_externs == 2, c.extern_ops


def test_a_computed_operand_eager_passes_transposed_is_written_in_memory_order():
    """`h.t() @ g` with h computed (a weight gradient): h's kernel writes h row by row and
    the matmul receives the transposed view (the buffer is allocated as that view), as
    eager's; written in the transpose's order,
    every store of that kernel was strided (a GPT-2 backward's GELU: 6x slower on H100)."""
    a, b = torch.randn(8, 4), torch.randn(8, 3)
    with logs("ir_post_fusion"):          # a reader: the IR dumps are made
        c = check(lambda a, b: a.sin().t() @ b, a, b)
    code = c.artifacts["output_code.py"]
    mm = next(ln for ln in code.splitlines() if "torch.mm(" in ln)
    operand = mm.split("torch.mm(")[1].split(",")[0]
    # the buffer is allocated as the transposed view the matmul reads: no view made per call
    alloc = next(ln for ln in code.splitlines() if ln.strip().startswith(f"{operand} = empty_strided("))
    assert "(4, 8), (1, 4)" in alloc and "as_strided" not in mm, (alloc, mm)
    kernels = c.artifacts["ir_post_fusion.txt"]
    assert "outer=[8, 4]" in kernels or "outer=[32]" in kernels, kernels


def test_an_extern_output_nothing_reads_is_not_held_to_its_meta_layout():
    """bf16 embedding_bag with per_sample_weights: the CPU kernel returns an empty
    offset2bag where its meta function says one per index (OpInfo found the crash); the
    graph never reads it, so the generated code takes it as it comes."""
    import engine

    weight = torch.randn(10, 5, dtype=torch.bfloat16)
    idx, offsets = torch.tensor([1, 2, 4, 5, 4]), torch.tensor([0, 2])
    psw = torch.randn(5, dtype=torch.bfloat16)

    def bags(w, i, o, p):
        return torch.nn.functional.embedding_bag(i, w, o, mode="sum", per_sample_weights=p) * 2

    engine.reset()
    torch.testing.assert_close(engine.compile(bags, backend="inductor")(weight, idx, offsets, psw),
                               bags(weight, idx, offsets, psw))


def test_a_matmul_result_is_taken_as_aten_returns_it():
    # aten allocates a matmul's result contiguous on every device: no per-call layout check
    # (a GPT-2 training step makes 147 matmuls)
    c = check(lambda x, w, b: torch.relu(torch.addmm(b, x, w)) @ w.t(), torch.randn(8, 16), torch.randn(16, 16),
              torch.randn(16))
    calls = [ln.strip() for ln in c.source.split("def call")[1].splitlines() if "torch.addmm(" in ln or "torch.mm(" in ln]
    assert len(calls) == 2 and not any("ensure_layout" in ln for ln in calls), calls


# kernel, stride, padding, dilation, ceil_mode: ResNet's stem pool, a pool with no padding, a
# stride-1 one, a dilated one, ceil mode with windows hanging past the edge, and unequal sides
POOLS = [(3, 2, 1, 1, False), (2, 2, 0, 1, False), (3, 1, 1, 1, False), (3, 2, 1, 2, False),
         (3, 2, 1, 1, True), (2, 3, 1, 1, True), ((3, 2), (2, 1), (1, 0), 1, False)]


@pytest.mark.parametrize("pool", POOLS, ids=[str(p) for p in POOLS])
def test_max_pool_is_one_kernel_with_eagers_values_and_indices(pool):
    """A batch norm's output pooled (ResNet's stem) is one kernel with the pool's taps
    in it, no aten pooling call. Windows of NaN, of -inf only and of ties pick the index
    eager picks; channels-last input keeps eager's strides."""
    k, s, p, d, ceil = pool
    x = torch.randn(2, 3, 9, 10)
    x[0, 0, 1, 1] = float("nan")
    x[1, 2, :3, :3] = float("-inf")
    x[0, 1, 2:5, 2:5] = 0.5

    def pool_of(x, w):
        y = torch.relu(x * w.view(1, 3, 1, 1)) - 1 + x
        return F.max_pool2d(y, k, s, p, d, ceil_mode=ceil), F.max_pool2d(y, k, s, p, d, ceil_mode=ceil,
                                                                       return_indices=True)

    w = torch.randn(3)
    for inp in (x, x.to(memory_format=torch.channels_last)):
        c = check(pool_of, inp, w)
        assert c.n_externs == 0, c.source
        assert c(inp, w)[0].stride() == pool_of(inp, w)[0].stride()


def test_a_batch_norm_before_a_max_pool_is_stored_not_recomputed_per_tap():
    """ResNet's stem: batch norm (a square root and a division an element) and relu, then a
    3x3 pool. The normalized activation is stored once and the pool reads it, rather than
    recomputing it at each of the nine taps (one square root an element, not nine)."""
    x = torch.randn(2, 8, 12, 12).to(memory_format=torch.channels_last)
    mean, var, w, b = torch.randn(8), torch.rand(8) + 0.5, torch.randn(8), torch.randn(8)

    def stem(x, mean, var, w, b):
        return F.max_pool2d(torch.relu(F.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5)), 3, 2, 1)
    c = check(stem, x, mean, var, w, b)
    assert c.n_kernels == 2 and c.source.count("sqrt(") == 1, c.source    # one square root an element
    assert c(x, mean, var, w, b).stride() == stem(x, mean, var, w, b).stride()


def test_max_pool_of_bfloat16_is_exact():
    x = torch.randn(2, 4, 11, 11).to(torch.bfloat16)
    check(lambda x: F.max_pool2d(x, 3, 2, 1), x, rtol=0, atol=0)


def test_slice_bounds_past_the_ends_are_clamped_as_python_clamps_them():
    """Gemma2's sliding-window mask `mask[..., -4096:]` of 16 columns starts at column 0;
    its gradient is a slice_scatter with start=-4095, which the lowering read as -4079 (loads
    far before the source: nan and 1e35 in every k and v gradient)."""
    base, src = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    check(lambda b, s: [torch.slice_scatter(b, s, 2, -4095), torch.slice_scatter(b, s, 2, -4095, 2 ** 63 - 1),
                        torch.slice_scatter(b, s[..., :4], 2, -4), torch.slice_scatter(b, s[..., :0], 2, 20, 30),
                        torch.slice_scatter(b, s[..., :16], 2, -100, 100)], base, src)
    x = torch.randn(2, 16, requires_grad=True)
    grad = torch.autograd.grad(engine.compile(lambda x: (x[:, -4096:] * 2).sum(), backend="inductor")(x), x)[0]
    assert torch.equal(grad, torch.full_like(x, 2.0))
