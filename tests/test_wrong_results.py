"""No wrong results: programs the fuzzer and the OpInfo sweep found giving results that
differ from eager (or crashing), each compared with eager on every backend. Where a
program cannot be compiled correctly the engine breaks the graph (or runs aten ops) with a
reason, and the result is still eager's."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import engine
from tests.engine_helpers import fresh_engine, logs  # noqa: F401  (fresh_engine: autouse)

BACKENDS = ["eager", "aot_eager", "inductor"]


def same(got, expected):
    """Values, and whether each tensor requires grad and has a grad_fn, as eager's."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {type(got).__name__}"
        torch.testing.assert_close(got.detach(), expected.detach(), rtol=1e-4, atol=1e-5)
        assert got.requires_grad == expected.requires_grad, "requires_grad differs from eager"
        assert (got.grad_fn is None) == (expected.grad_fn is None), "grad_fn differs from eager"
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            same(g, e)
    else:
        assert got == expected


def run(fn, make_args, backend):
    """fn on one copy of the arguments eagerly, on another compiled; the results and the
    arguments afterwards (mutated inputs, module state) compared."""
    eager_args, compiled_args = make_args(), make_args()
    expected = fn(*eager_args)
    got = engine.compile(fn, backend=backend)(*compiled_args)
    same(got, expected)
    for a, b in zip(compiled_args, eager_args):
        if isinstance(a, torch.nn.Module):
            for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
                torch.testing.assert_close(x, y, msg=f"module state {name} differs from eager")
        elif isinstance(a, torch.Tensor):
            torch.testing.assert_close(a.detach(), b.detach(), msg="a mutated input differs from eager")
    return got


# -- K10: a mutation the op's schema does not declare ----------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_batchnorm_in_training_updates_running_stats_when_its_output_is_unused(backend):
    def f(bn, x):
        bn(x)                   # only the running_mean/running_var update matters
        return x + 1

    def make():
        torch.manual_seed(0)
        return torch.nn.BatchNorm1d(3).train(), torch.randn(4, 3)

    run(f, make, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_batch_norm_and_instance_norm_update_their_stats(backend):
    def f(x, rm, rv):
        torch.nn.functional.batch_norm(x, rm, rv, training=True)
        torch.nn.functional.instance_norm(x.t()[None], rm, rv, use_input_stats=True)
        return x.sum()

    def make():
        torch.manual_seed(0)
        return torch.randn(4, 3), torch.zeros(3), torch.ones(3)

    run(f, make, backend)


# -- K2: a view of a mutated input that is strided or at a storage offset ----------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["offset", "transposed", "offset_and_transposed"])
def test_view_of_an_input_mutated_in_place(layout, backend):
    def f(w):
        w.mul_(2)
        return w[0], w[:, 1:]

    def make():
        base = torch.arange(24.).view(4, 6)
        return {"offset": base[:, 1:-1], "transposed": base.t(), "offset_and_transposed": base[1:, 1:].t()}[layout],

    run(f, make, backend)


# -- K1, K5, K4: data-dependent output sizes (nonzero, unique, masked_select, t[t > 0]) ---------
# The ops are captured; their sizes are unbacked symbols (u0), read from the tensors where
# Python code uses them. The AOT stage and codegen cannot compile such graphs: they run the
# captured ops (the reason on the `aot` log and perf_hints).

X = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_dependent_sizes_in_python(backend):
    def f(x):
        pos = x[x > 0]
        return pos.shape[0] + 1, pos.expand(2, *pos.shape) * 2, pos.sum()

    run(f, lambda: (X.clone(),), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_dependent_ops(backend):
    def f(x):
        t = x.detach()
        picked = t[t > 0]
        picked.add_(picked, alpha=2)
        return torch.unique(x) * 2, torch.nonzero(x) + 1, torch.masked_select(x, x > 0).cos(), picked

    run(f, lambda: (X.clone(),), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_dependent_size_with_gradients(backend):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.linspace(-1, 1, 6))

        def forward(self, z):
            t0 = self.scale[self.scale > 0]
            return (z[:, :t0.shape[0]] * t0).sum()

    torch.manual_seed(0)
    m = M()
    z = torch.randn(3, 6)
    expected = m(z)
    expected.backward()
    grad = m.scale.grad.clone()
    m.scale.grad = None
    got = engine.compile(m, backend=backend)(z)
    same(got, expected)
    got.backward()
    torch.testing.assert_close(m.scale.grad, grad)


# -- named results of torch ops (torch.return_types): fields, indexing, unpacking --------------

def named_results(x):
    top = torch.topk(x, 2)
    lo, lo_idx = x.min(1)
    return (x.max(-1).values * 2, x.max(dim=0).indices + 1, torch.min(x, 1).values.clamp(0), lo + lo_idx,
            x.sort(-1)[1] * 1, x.sort(-1).values.exp(), top.indices + top[0].long(), x.kthvalue(2, 1).values.neg(),
            x.round().mode(1).indices * 1, x.median(1).values.abs(), torch.aminmax(x).max + 1, len(x.max(-1)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_named_results_of_torch_ops(backend):
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    run(named_results, lambda: (x.clone(),), backend)


def test_named_results_do_not_break_the_graph():
    torch.manual_seed(0)
    report = engine.explain(named_results)(torch.randn(3, 4))
    assert report.graph_count == 1 and report.graph_break_count == 0, report.break_reasons


# -- torch.linalg ops with error checks (aten._linalg_check_errors, an ordered side effect) -------
# Functionalization has no token for the effect: the graph runs its captured ops (the reason
# on the `aot` log), so a singular input still raises as in eager.

LINALG = {
    "cholesky": lambda a: torch.linalg.cholesky(a) * 2,
    "inv": lambda a: torch.linalg.inv(a) + 1,
    "solve": lambda a: torch.linalg.solve(a, a[:, :1]),
    "lu_factor": lambda a: torch.linalg.lu_factor(a)[0].exp(),
    "ldl_factor": lambda a: torch.linalg.ldl_factor(a.detach())[0] - 1,
    "tensorinv": lambda a: torch.linalg.tensorinv(a, ind=1),
    "tensorsolve": lambda a: torch.linalg.tensorsolve(a, a[:, 0]),
}


def _spd(requires_grad=False):
    torch.manual_seed(0)
    x = torch.randn(3, 3)
    return (x @ x.mT + 3 * torch.eye(3)).requires_grad_(requires_grad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(LINALG))
def test_linalg_ops_with_error_checks(name, backend):
    fn = LINALG[name]
    run(fn, lambda: (_spd(),), backend)
    a, b = _spd(True), _spd(True)
    expected, got = fn(a), engine.compile(fn, backend=backend)(b)
    same(got, expected)
    if expected.requires_grad:           # ldl_factor has no derivative: its input is detached
        expected.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_linalg_error_on_a_singular_input_is_eagers(backend):
    with pytest.raises(torch.linalg.LinAlgError):
        engine.compile(LINALG["cholesky"], backend=backend)(-torch.eye(3))


# -- K6, K11: requires_grad of results when in-place ops go through .detach() ---------------------

def _leaf_and_other():
    torch.manual_seed(0)
    return torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)


def detached_then_mutated(x, z):
    w = x * 2
    y = w.detach()
    y.mul_(2)               # writes w's memory too; w keeps its grad_fn, y requires no grad
    return w, y


def detached_input_mutated(x, z):
    y = x.detach()
    y.mul_(2)
    return y, x * 1


def detached_gains_grad(x, z):
    y = (x * 2).detach()
    y.add_(z)               # y now requires grad, through z
    return y, y.sum()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [detached_then_mutated, detached_input_mutated, detached_gains_grad])
def test_requires_grad_through_detach_and_inplace(fn, backend):
    run(fn, _leaf_and_other, backend)


# -- an expanded input (one memory location seen many times) written through an index ---------

@pytest.mark.parametrize("backend", BACKENDS)
def test_expanded_input_written_at_one_index(backend):
    def f(z):
        z[-1] = z[0] + 1
        return z * 1

    run(f, lambda: (torch.tensor([2.0]).expand(6),), backend)


# -- a gradient only from outputs the loss does not use is None, as in eager (not zeros) ---------

@pytest.mark.parametrize("backend", BACKENDS)
def test_input_reached_only_through_an_unused_output_gets_no_grad(backend):
    def f(x, y):
        return x.cos() + 1, (y * 2).sum(), x * y

    def grads(fn):
        torch.manual_seed(0)
        x, y = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        fn(x, y)[0].sum().backward()          # only the first output is in the loss
        return x.grad, y.grad

    (ex, ey), (gx, gy) = grads(f), grads(engine.compile(f, backend=backend))
    torch.testing.assert_close(gx, ex)
    assert ey is None and gy is None


# -- results that share the input's memory though their op's schema says they do not -----------

@pytest.mark.parametrize("op", [lambda x: torch.unsafe_split(x, 2), lambda x: torch.unsafe_chunk(x, 3, 1)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_unsafe_split_results_are_views_of_the_input_as_in_eager(op, backend):
    x = torch.randn(5, 6)
    parts = engine.compile(op, backend=backend)(x)
    same(parts, op(x.clone()))
    for p in parts:    # writing through a result writes the input, as eager's views do
        assert p.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    parts[0].fill_(7.0)
    assert (op(x)[0] == 7.0).all()


# -- two results that are views of one intermediate: writing through one changes the other ----

@pytest.mark.parametrize("backend", BACKENDS)
def test_results_that_view_one_intermediate_stay_views_of_it(backend):
    """Fuzzer seed 40121: `t3` and `t3[::2]` leave the graph (at a break) as views of `t0`,
    which is not a result itself; eager code then writes through the second one."""
    def f(x, y):
        t0 = y * x + y
        t2 = t0.mul_(x).amax(0)
        t3 = F.leaky_relu(t0[1:], 0.2, inplace=True)
        v = t3[::2]
        engine.graph_break()
        v.lerp_(t2, 0.5)
        return t3.clamp(-0.5, 0.5)

    def inputs():
        g = torch.Generator().manual_seed(0)
        return torch.randn(6, 7, dtype=torch.float64, generator=g), torch.randn(6, 7, generator=g)

    run(f, inputs, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_result_and_its_transpose_stay_one_tensor_and_compile(backend):
    """CLIP returns `logits_per_text` and `logits_per_image = logits_per_text.t()`: in eager
    the second is a view of the first, so writing into one changes the other. The inductor
    backend ran that graph uncompiled rather than return two buffers; now both are views
    of one buffer and the graph compiles."""
    def f(a, b, scale):
        per_text = torch.matmul(a, b.t()) * scale.exp()
        return per_text.t(), per_text

    def inputs():
        g = torch.Generator().manual_seed(0)
        return torch.randn(4, 8, generator=g), torch.randn(5, 8, generator=g), torch.tensor(0.5)

    with logs("perf_hints") as hints:
        per_image, per_text = run(f, inputs, backend)
    assert not any("uncompiled" in h for h in hints), hints
    assert per_image.data_ptr() == per_text.data_ptr()
    per_text.zero_()
    assert (per_image == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bf16_batch_norm_updates_its_running_stats_like_eager(backend):
    """OpInfo `_batch_norm_with_update` in bfloat16: the aten kernel returns the new running
    stats in bf16 where its meta function says float32, and the inductor backend read that
    memory as float32 (garbage running stats). An extern result in another dtype than
    traced is converted."""
    def f(x, w, b, mean, var):
        return torch.ops.aten._batch_norm_with_update(x, w, b, mean, var, 0.5, 0.6)[0] * 2

    def inputs():
        g = torch.Generator().manual_seed(0)
        return [torch.randn(*s, generator=g).bfloat16() for s in ((5, 5, 5), (5,), (5,), (5,))] + \
            [torch.rand(5, generator=g).bfloat16()]

    run(f, inputs, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32])
def test_isinf_and_isnan_of_integers_are_false(backend, dtype):
    """OpInfo sweep, int64 and bool: the inductor backend's isinf compared the integer with
    infinity cast to an integer, so isinf(0) was True."""
    def inputs():
        t = torch.tensor([3, -2, 0, -1, 5, 1])
        return (t.to(dtype) if dtype is not torch.float32 else torch.tensor([0.0, float("inf"), -float("inf"), -1.0]),)

    run(lambda t: (torch.isinf(t), torch.isnan(t), torch.isinf(t * 2)), inputs, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tensor_and_its_detach_crossing_a_break_keep_the_gradient(backend):
    """Fuzzer seed 70688: `t0` and `t0.detach()` leave the first graph (at a break) as one
    buffer; autograd tied that tensor to the detached slot, so t0's gradient was dropped
    (x.grad 1 instead of 2)."""
    def f(x, running):
        t0 = x - running
        t1 = t0.detach()
        engine.graph_break()
        return (t0 * 1.0 + (t1 * 0).relu()).sum() + x.sum()

    def grad_of(fn):
        leaf = torch.randn(7, requires_grad=True)
        fn(leaf.clone(), torch.zeros(7)).backward()
        return leaf.grad

    torch.testing.assert_close(grad_of(engine.compile(f, backend=backend)), grad_of(f))


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_output_that_views_an_intermediate_can_be_modified_in_place(backend):
    """Fuzzer seed 70335: `lin(v)` on a 1-D v is a view of the matmul in the graph; returned
    from the compiled autograd.Function as it was, autograd refused the user's in-place
    update after a break ("Output 0 of CompiledFunction is a view and is being modified
    inplace"), which eager allows."""
    lin = torch.nn.Linear(7, 7)

    def f(v, y):
        t1 = lin(v)
        t3 = t1.squeeze()
        engine.graph_break()
        t1.mul_(2.0)
        return t3 + y

    def inputs():
        g = torch.Generator().manual_seed(0)
        return torch.randn(7, generator=g), torch.randn(7, generator=g)

    run(f, inputs, backend)


class _DynamicMask(torch.nn.Module):
    """Doge's dynamic attention mask (transformers): a softplus whose gradient arrives
    transposed."""

    def __init__(self):
        super().__init__()
        self.dt_proj = torch.nn.Linear(8, 4)
        self.A = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return torch.exp(self.A * F.softplus(self.dt_proj(x))).transpose(-1, -2)


@pytest.mark.parametrize("backend", BACKENDS + ["aot_eager_decomp_partition"])
def test_a_backward_kernel_laying_out_its_result_unlike_its_meta_still_runs(backend):
    # On CPU softplus_backward keeps the transposed strides of its incoming gradient where its
    # meta function says contiguous, and the backward's `view` for the linear's gradient
    # raised "view size is not compatible" (aot_eager; Doge, Qwen3.5 and Qwen3-Next training).
    torch.manual_seed(0)
    model, x = _DynamicMask(), torch.randn(2, 16, 8)
    compiled = engine.compile(copy.deepcopy(model), backend=backend)
    for m in (model, compiled):
        m(x).sum().backward()
    for p, q in zip(model.parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_relu_keeps_negative_zero_as_eager_does(backend):
    # fuzz seed 401427: relu(-0.0) is -0.0 in eager, and atan2(-0.0, -0.0) is -pi; the
    # generated relu returned +0.0, and atan2 gave 0.
    def fn(x):
        t = torch.relu_(x.round())
        return torch.atan2(t, t), torch.relu(x.round())

    x = torch.tensor([-0.3, 0.2, -1.7, 2.4, float("nan")])
    for got, want in zip(engine.compile(fn, backend=backend)(x), fn(x)):
        torch.testing.assert_close(got, want, equal_nan=True)
        assert torch.equal(torch.signbit(got), torch.signbit(want)), (got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_addcmul_of_integers_with_a_float_value_computes_as_eager(backend):
    # fuzz seed 403580: eager truncates `value` on an integer tensor; torch's reference
    # decomposition raised instead, and the inductor backend crashed
    def fn(x, y):
        y.fill_(2)
        y.addcmul_(y, y, value=0.5)
        return x.addcmul(x, x, value=1.5)

    x, want_x = torch.arange(-3, 4), torch.arange(-3, 4)
    got = engine.compile(fn, backend=backend)(x, x)
    want = fn(want_x, want_x)
    assert torch.equal(got, want) and torch.equal(x, want_x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_variance_of_one_element_is_nan_as_in_eager(backend):
    # fuzz seed 404034: the one element's deviation from its mean is exactly 0 in eager
    # (0/0: nan); silu recomputed in the other loop differed in the last bit, and gave inf
    def fn(w):
        t = F.silu(w)
        return t.std(), t.var(correction=0), F.gelu(w * 3).var(0, keepdim=True)

    w = torch.tensor([0.7311])
    for got, want in zip(engine.compile(fn, backend=backend)(w), fn(w)):
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tensor_made_from_a_list_is_new_on_every_call(backend):
    # fuzz seed 405199: `torch.tensor([...])` lives across a graph break and is written
    # after it; the generated code returned the graph's constant itself, so the write
    # changed it for every later call
    def fn(z):
        t = torch.tensor([1.0, -2.0, 3.0])
        float(z.mean())                  # a graph break
        before = t.cos() + t
        t[1:] = z
        return before.softmax(-1), t

    f = engine.compile(fn, backend=backend)
    for _ in range(3):
        z = torch.randn(2)
        for got, want in zip(f(z), fn(z)):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_out_tensor_of_another_size_is_resized_as_eager_resizes_it(backend):
    """`torch.maximum(w, x, out=z)` with z of another size: eager resizes z (with a
    warning). The graph would have copied into z as it was (fuzz 411215: the size of tensor
    a (6) must match the size of tensor b (8)); the call breaks the graph instead, and says so."""
    w = torch.randn(8, 5)

    def fn(x, z):
        torch.maximum(w, x, out=z)
        return z * 2

    with logs("graph_breaks") as shown, pytest.warns(UserWarning, match="resized"):
        got = run(fn, lambda: (torch.linspace(-1, 1, 5), torch.zeros(6, 5)), backend)
    assert got.shape == (8, 5)
    assert any("out= tensor of another size" in s for s in shown), shown
    run(fn, lambda: (torch.linspace(-1, 1, 5), torch.zeros(8, 5)), backend)     # the same size: no break


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_random_op_with_out_draws_eagers_numbers_on_the_compiling_call(backend):
    """Asking whether `randn(3, out=z)` resizes z must not run randn: the compiling call
    drew three numbers more than eager did, and every random number after was shifted."""
    def fn(z):
        torch.randn(3, out=z)
        return z * 2, torch.rand(2)

    torch.manual_seed(0)
    expected = fn(torch.empty(3))
    torch.manual_seed(0)
    got = engine.compile(fn, backend=backend)(torch.empty(3))
    same(got, expected)


# -- views, grad mode and in-place writes across the compiled boundary ----------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_written_under_no_grad_then_sliced_with_grad_on_compiles(backend):
    """`t = y[:3]`, written under `no_grad`, then sliced with grad on and returned (fuzz
    411326). The output needs no gradient of the graph, so the AOT stage traced it as an
    inference graph, all of it under no_grad: the slice taken after the block met autograd's
    check on views made in no_grad mode, and compiling failed."""
    def fn(y):
        t = y[:3]
        with torch.no_grad():
            t.mul_(1.5)
        return t[::2]

    def make():
        torch.manual_seed(0)
        return (torch.randn(4, requires_grad=True),)

    got = run(fn, make, backend)
    got.sum().backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_written_in_place_keeps_its_old_value_for_the_backward(backend):
    """`x[0].mul_(z)` with z requiring grad (fuzz 313377): z's gradient is the old `x[0]`.
    The forward saved a view of x for the backward, and the call then wrote the new value
    into x, so the backward refused the view (made under the forward's no_grad, then
    written). A saved view of an input the call writes is now saved as a copy."""
    def fn(x, z):
        return x[0].mul_(z)

    def make():
        torch.manual_seed(0)
        return torch.randn(4, 3), torch.randn((), requires_grad=True)

    eager_args, compiled_args = make(), make()
    expected = fn(*eager_args)
    got = engine.compile(fn, backend=backend)(*compiled_args)
    same(got, expected)
    expected.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(compiled_args[1].grad, eager_args[1].grad)
    torch.testing.assert_close(compiled_args[0], eager_args[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_transpose_in_place_after_a_view_keeps_the_views_gradient(backend):
    """`t1 = t0.select(1, -1)`, then `t0.transpose_(0, 1)` (fuzz 313345). Functionalization
    replays t1 on t0's new strides, so its gradient went to row -1 instead of column -1
    (torch.compile too). The in-place transpose of a tensor with views breaks the graph."""
    def fn(y):
        t0 = y * 2
        t1 = t0.select(1, -1)
        t0.transpose_(0, 1)
        return t1, t0

    ys = [torch.arange(16.).reshape(4, 4).requires_grad_() for _ in range(2)]
    with logs("graph_breaks") as shown:
        got = engine.compile(fn, backend=backend)(ys[1])
    expected = fn(ys[0])
    same(got, expected)
    weights = torch.tensor([1., 10., 100., 1000.])
    (expected[0] * weights).sum().backward()
    (got[0] * weights).sum().backward()
    torch.testing.assert_close(ys[1].grad, ys[0].grad)
    assert any("transpose_() on a tensor that requires grad and has views" in s for s in shown), shown


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_returned_views_of_one_intermediate_stay_views_of_it(backend):
    """`t1 = t0.select(1, -1)` and `t3 = t1.unsqueeze(0)` returned across a graph break,
    then `leaky_relu_(t1)` and a slice of t3 returned (fuzz 316766). The graph returned t1
    and t3 as independent tensors sharing memory, so the in-place write changed t3's values
    but not its gradient (1.0 where eager's is 0.2). Both are now real views of their base,
    which the graph returns too, hidden."""
    def fn(x):
        t0 = x * 1
        t1 = t0.select(1, -1)
        t3 = t1.unsqueeze(0)
        engine.graph_break()
        t6 = t3[:2]
        F.leaky_relu(t1, 0.2, inplace=True)
        return t6

    xs = [torch.tensor([[1., -2., -3.], [4., 5., -6.]], requires_grad=True) for _ in range(2)]
    expected = fn(xs[0])
    got = engine.compile(fn, backend=backend)(xs[1])
    same(got, expected)
    expected.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(xs[1].grad, xs[0].grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float64_sum_over_two_stacked_copies_is_not_halved(backend):
    """`torch.stack([t2, t2.detach()], -1).sum(-1)` of a float64 mean (fuzz 414119): the C++
    kernel's sum over the two pieces was an `omp simd` reduction of 2 iterations, which
    g++ 12 -O3 -fopenmp compiled to a loop that lost one: half of eager's value. Loops that
    short are no longer SIMD loops."""
    def fn(x):
        t2 = x.mean(0)
        return torch.stack([t2, t2.detach()], -1).sum(-1)

    run(fn, lambda: (torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)),), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cat_written_in_place_keeps_its_second_half(backend):
    """`torch.cat([z, x])` then `abs_`, `mul_`, `add_`, beside `x.max()` (fuzz 417442): the C++
    kernel read each row of the cat under an `if` on the row, and g++ 12 and 13 at -O3
    -march=native vectorized the loop over the 10 rows, 8 at a time, and lost the second
    conditional load: rows 5-7 came out as if x were 0. A masked value whose loads stay in
    bounds is now computed whatever the mask and then selected, with no branch."""
    def fn(x, z):
        t0 = torch.cat([z, x])
        t0.abs_()
        t0.mul_(2).add_(1)
        return t0, x.max()

    def make():
        g = torch.Generator().manual_seed(24031)
        return torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g).requires_grad_()

    run(fn, make, backend)   # z requires grad: the kernel also stores abs's sign for the backward


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_linear_then_scale_then_relu_has_eager_weight_gradients(backend):
    """`relu(lin(x) * scale)` on 6 rows of 5, beside `softmax(scale)` (fuzz 418869): g++ 12
    and 13 at -O3 -march=native vectorized the backward kernel's loop over the rows, a loop
    nobody marked for SIMD, and applied relu's mask to the wrong elements: the weight and
    bias gradients were off by up to 1.1. A kernel with such a nest is not auto-vectorized now."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(5, 5)
            self.scale = torch.nn.Parameter(torch.linspace(-1, 1, 5))

        def forward(self, t):
            return (self.lin(t) * self.scale).relu()

    def fn(net, x):
        return torch.softmax(net.scale, -1).unsqueeze(0), net(x)

    torch.manual_seed(0)
    eager_net = Net()
    compiled_net = copy.deepcopy(eager_net)
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(24105))
    expected = fn(eager_net, x)
    got = engine.compile(fn, backend=backend)(compiled_net, x)
    same(got, expected)
    sum(t.sum() for t in expected).backward()
    sum(t.sum() for t in got).backward()
    for (name, p), q in zip(eager_net.named_parameters(), compiled_net.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=f"{name}'s gradient differs from eager")


@pytest.mark.parametrize("backend", BACKENDS)
def test_std_of_equal_values_is_zero_and_its_gradient_too(backend):
    """`(a * b).std()` where both elements are the same value (fuzz 423863): g++ fused each
    product into the subtraction of the mean (an FMA, which rounds once), so the deviation
    was the product's rounding error, std 1.5e-18 and its gradient -0.41 where eager's std
    is 0 and so is its gradient. Generated C++ rounds after every op now, as eager does."""
    def fn(y, z):
        y[...] = z
        t0 = y / (z.abs() + 1)
        engine.graph_break()
        t2 = t0.clamp(-0.5, 0.5)
        return (t2 * t0).std()

    def make():
        g = torch.Generator().manual_seed(6528)
        torch.randn(10, generator=g)
        y = torch.randn(2, generator=g, dtype=torch.float64)
        z = torch.randn((), generator=g).requires_grad_()
        return y, z, z.clone()

    (y0, leaf0, z0), (y1, leaf1, z1) = make(), make()
    expected = fn(y0, z0)   # std 0: the product t2 * t0 is the same value twice
    got = engine.compile(fn, backend=backend)(y1, z1)
    same(got, expected)
    expected.backward()
    got.backward()
    torch.testing.assert_close(leaf1.grad, leaf0.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_detached_alias_written_with_a_gradient_leaves_the_input_without_one(backend):
    """`t0 = xs[1].detach()`, a graph break, then `t0[:, 1:].lerp_(y, 0.5)` with y requiring
    grad (fuzz 418293). Eager's t0 shares xs[1]'s memory, not its autograd history, so the
    write makes t0 require grad and leaves xs[1] as it was. The first graph returned t0 as a
    view of xs[1] for autograd too, and the write made xs[1] require grad."""
    def fn(y, xs):
        t0 = xs[1].detach()
        engine.graph_break()
        t0[:, 1:].lerp_(y, 0.5)
        return t0

    def make():
        g = torch.Generator().manual_seed(62899)
        return torch.randn((), generator=g).requires_grad_(), [torch.randn(5, 3, generator=g) for _ in range(2)]

    (y0, xs0), (y1, xs1) = make(), make()
    expected = fn(y0, xs0)
    got = engine.compile(fn, backend=backend)(y1, xs1)
    same(got, expected)
    assert xs1[1].requires_grad == xs0[1].requires_grad is False
    torch.testing.assert_close(xs1[1], xs0[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_detached_alias_written_with_a_gradient_in_the_graph_keeps_the_gradient(backend):
    """The same write inside one graph: `w.detach().addcmul_(y, y)` returned (fuzz 444319 and
    six more on inductor). The output was rebuilt after the call as a view of w, which
    has no gradient history: it came back not requiring grad, and y got no gradient
    through it. Such a graph now runs eagerly, with the reason logged."""
    def fn(w, y):
        return w.detach().addcmul_(y, y, value=0.5)

    def make():
        g = torch.Generator().manual_seed(56610)
        return torch.randn(4, generator=g), torch.randn(4, generator=g, dtype=torch.float64).requires_grad_()

    (w0, y0), (w1, y1) = make(), make()
    expected = fn(w0, y0)
    with logs("aot") as records:
        got = engine.compile(fn, backend=backend)(w1, y1)
    same(got, expected)
    assert got.untyped_storage().data_ptr() == w1.untyped_storage().data_ptr()
    torch.testing.assert_close(w1, w0)
    assert not w1.requires_grad
    expected.sum().backward()
    got.sum().backward()
    torch.testing.assert_close(y1.grad, y0.grad)
    if backend != "eager":
        assert any("detached alias of input 0 written in place" in line for line in records)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_data_dependent_size_is_read_before_an_in_place_transpose(backend):
    """`t = y[y[:, 0] > 0]` (u0 rows), `t.transpose_(0, 1)`, then `torch.eye(t.shape[-1])`
    (fuzz 328441): the graph read u0 as dim 0 of t after the transpose, which is 1. Sizes
    that depend on the data are read where their tensor is made."""
    def fn(x, y):
        t = y[y[:, 0] > 0]
        t.add_(x.shape[0])
        t.transpose_(0, 1)
        return torch.eye(t.shape[-1])

    for rows in ([-0.9, -0.7], [0.5, -0.7], [0.5, 0.7]):
        run(fn, lambda: (torch.zeros(2, 4), torch.tensor(rows).reshape(2, 1)), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_output_the_loss_does_not_use_adds_no_nan_to_the_gradient(backend):
    """The first graph returns `t = stack([x * 0, y]).abs().sqrt()` across a break, and the
    loss never uses t (fuzz 429014). Eager never runs t's backward; the compiled backward
    took a zero gradient for t, and `0 / (2 * sqrt(0))` made x's gradient NaN. A backward
    call where an output got no gradient runs a backward without that output's part, and
    the log says so."""
    def fn(x, y):
        used = x.clamp(-0.5, 0.5)
        t = torch.stack([x * 0, y]).abs().sqrt()
        if (x / (y.abs() + 1)).sum() > 1000:
            t = t + 1
        return used * 2

    def make():
        g = torch.Generator().manual_seed(59951)
        return torch.randn(4, 6, generator=g).requires_grad_(), torch.randn(4, 6, generator=g)

    (x0, y0), (x1, y1) = make(), make()
    fn(x0, y0).sum().backward()
    with logs("aot") as records:
        engine.compile(fn, backend=backend)(x1, y1).sum().backward()
    torch.testing.assert_close(x1.grad, x0.grad)
    assert not x1.grad.isnan().any()
    if backend != "eager":
        assert any("no gradient for tangents" in line for line in records)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backward_without_an_unused_outputs_part_keeps_its_zeros_dense(backend):
    """The zeros standing in for a missing gradient have zeros_like's dense layout, not the
    layout of the gradient they replace: that one was an expansion (stride 0), and the
    generated code refused to copy a result into it (fuzz 432520, 439227)."""
    def fn(x, y, z):
        t0 = (x + y) * 3
        t1 = t0.clamp(-0.5, 0.5)
        t3 = t0.sigmoid()
        v0 = z.sum().item()
        t5 = t0 * v0 + t3                  # unused: t3 crosses the break and gets no gradient
        return t1.norm()

    def make():
        g = torch.Generator().manual_seed(13104)
        x = torch.randn((4, 3), generator=g)
        y_leaf = torch.randn((), generator=g).requires_grad_()
        z = torch.randn((3,), generator=g).requires_grad_()
        return x, y_leaf, z

    compiled = engine.compile(fn, backend=backend)
    x, y, z = make()
    compiled(x, y.detach(), z.detach())     # a first call without gradients, then one with
    (x0, y0, z0), (x1, y1, z1) = make(), make()
    fn(x0, y0.clone(), z0).backward()
    compiled(x1, y1.clone(), z1).backward()
    torch.testing.assert_close(y1.grad, y0.grad)
    assert z1.grad is None and z0.grad is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_buffer_written_after_the_forward_was_not_saved_only_to_recompute(backend):
    """`where(t > m.running, t, m.running)`, a break, then `m.running.mul_(0.9)` (fuzz 425449).
    Eager's where saves its condition. Min-cut saved the buffer instead, to recompute the
    comparison in the backward; the generated code wrote the buffer in place, and the
    backward compared with the new values: sin(y) = 0.47 is below 0.5 but above 0.45, and
    y's gradient was cos(y) where eager's is 0. An input that gets no gradient is now saved
    only where the backward reads it."""
    def make():
        module = torch.nn.Module()
        module.register_buffer("running", torch.full((7,), 0.5))
        return torch.full((5, 7), math.asin(0.47)).requires_grad_(), module

    def fn(y, m):
        t = torch.sin(y)
        out = torch.where(t > m.running, t, m.running)
        engine.graph_break()
        m.running.mul_(0.9)
        return out

    (y0, m0), (y1, m1) = make(), make()
    fn(y0, m0).sum().backward()
    engine.compile(fn, backend=backend)(y1, m1).sum().backward()
    torch.testing.assert_close(y1.grad, y0.grad)
    torch.testing.assert_close(m1.running, m0.running)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_with_a_gradient_written_after_the_forward_was_not_saved_only_to_recompute(backend):
    """`where(y > softmax(z), y, z)`, a break, then `y.mul_(2)` on the caller's y (fuzz
    902531). Eager's where saves its condition, and the program runs. Min-cut saved y
    instead, to recompute the comparison in the backward (the rule above covered only
    inputs without a gradient), and the backward failed its version check. An input other
    than a parameter is now saved only where the backward reads it, or where nothing else
    can be saved."""
    def make():
        y_leaf, z_leaf = torch.randn(3, 4, requires_grad=True), torch.randn(3, 1, requires_grad=True)
        return y_leaf, z_leaf

    def fn(y, z):
        t = torch.where(y > z.softmax(0), y, z).sigmoid()
        engine.graph_break()
        y.mul_(2)
        return t

    torch.manual_seed(0)
    (y0, z0), (y1, z1) = make(), make()
    with torch.no_grad():
        y1.copy_(y0)
        z1.copy_(z0)
    fn(y0.clone(), z0.clone()).sum().backward()
    engine.compile(fn, backend=backend)(y1.clone(), z1.clone()).sum().backward()
    torch.testing.assert_close(y1.grad, y0.grad)
    torch.testing.assert_close(z1.grad, z0.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_buffer_updated_from_a_parameter_on_every_call_backpropagates_every_call(backend):
    """`m.running.lerp_(m.scale, 0.5)` on each call (fuzz 912548): the buffer's history
    chains the calls, so the second call's backward runs the first call's node again. Eager's
    lerp saved nothing, and that runs; the compiled node saved nothing either, but read its
    (freed) saved-tensor list and raised "backward through the graph a second time"."""
    def make():
        m = torch.nn.Module()
        m.scale = torch.nn.Parameter(torch.linspace(-1, 1, 3))
        m.register_buffer("running", torch.zeros(3))
        return m

    def fn(m):
        m.running.lerp_(m.scale, 0.5)
        return m.running[1:]

    m0, m1 = make(), make()
    compiled = engine.compile(fn, backend=backend)
    for _ in range(2):
        fn(m0).sum().backward()
        compiled(m1).sum().backward()
        torch.testing.assert_close(m1.scale.grad, m0.scale.grad)
        torch.testing.assert_close(m1.running, m0.running)


def _hypot_of_the_buffer(m, x):
    m.running.add_(m.scale)
    return torch.hypot(m.running, x)


def _buffer_times_input(m, x):
    m.running.lerp_(m.scale, 0.5)
    return m.running[1:], torch.sin(m.running) * x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [_hypot_of_the_buffer, _buffer_times_input])
def test_a_buffer_updated_from_a_parameter_beside_ops_that_save_tensors(backend, fn):
    """The same chain through calls where the graph also saves tensors for its other ops
    (fuzz 924288, 912548): the second call's backward reaches the first call's node with a
    gradient for the updated buffer alone. Eager's node for the update saved nothing; the
    compiled node's saved tensors (hypot's, sin's) were freed by the first backward, and
    reading them raised "backward through the graph a second time". A backward that reads
    none of them now runs without them, with eager's gradients."""
    def make():
        m = torch.nn.Module()
        m.scale = torch.nn.Parameter(torch.linspace(-1, 1, 3))
        m.register_buffer("running", torch.zeros(3))
        return m

    m0, m1 = make(), make()
    compiled = engine.compile(fn, backend=backend)
    for i in range(3):
        x = torch.randn(3, generator=torch.Generator().manual_seed(i))
        sum(o.sum() for o in torch.atleast_1d(fn(m0, x))).backward()
        sum(o.sum() for o in torch.atleast_1d(compiled(m1, x))).backward()
        torch.testing.assert_close(m1.scale.grad, m0.scale.grad)
        torch.testing.assert_close(m1.running, m0.running)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_the_generated_code_writes_in_place_fails_a_backward_that_saved_it(backend):
    """Eager's `x * w` saves w; a compiled `w.mul_(2)` then changes it. Eager's backward
    raises; the generated code wrote w through a pointer, autograd did not see the write, and
    the backward used the new w. The epilogue now counts the write as an in-place op does."""
    w, x = torch.randn(3), torch.randn(3, requires_grad=True)
    y = x * w
    engine.compile(lambda w: w.mul_(2), backend=backend)(w)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def _exp_and_sin(x):
    # exp's backward reads its result y; sin's reads x. The compiled graph saves y for y's
    # gradient only.
    return x.exp(), x.sin()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tensor_saved_only_for_an_unused_output_may_be_written_in_place(backend):
    """The caller writes y in place and the loss uses only z (fuzz 345578). Eager never runs
    y's backward node, which saved y; the compiled backward is one node, and autograd's
    version check of all its saved tensors raised. A saved tensor that not every backward
    needs is now checked only by a backward that reads it."""
    x0, x1 = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    x1.data.copy_(x0.detach())
    x1.requires_grad_()
    y0, z0 = _exp_and_sin(x0)
    y1, z1 = engine.compile(_exp_and_sin, backend=backend)(x1)
    y0.mul_(2)
    y1.mul_(2)
    z0.sum().backward()
    z1.sum().backward()
    torch.testing.assert_close(x1.grad, x0.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tensor_saved_for_a_used_output_and_written_in_place_fails_the_backward(backend):
    """The same program with y in the loss: eager's backward raises, and so does the
    compiled one, which saved y as eager's exp does (it checks y's version itself). Min-cut
    once saved x instead, the program's input, to recompute exp, and the backward ran where
    eager's raises; an input is now saved only where the backward reads it."""
    x = torch.randn(3, 4, requires_grad=True)
    for fn in (_exp_and_sin, engine.compile(_exp_and_sin, backend=backend)):
        y, z = fn(x)
        y.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (y.sum() + z.sum()).backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_backward_through_a_graph_with_an_optional_saved_tensor(backend):
    """A second backward fails as eager's does, unless the first retained the graph; then
    both give eager's gradients."""
    compiled = engine.compile(_exp_and_sin, backend=backend)
    for fn in (_exp_and_sin, compiled):
        y, z = fn(torch.randn(3, 4, requires_grad=True))
        loss = y.sum() + z.sum()
        loss.backward()
        with pytest.raises(RuntimeError, match="second time"):
            loss.backward()
    grads = []
    for fn in (_exp_and_sin, compiled):
        x = torch.linspace(-1, 1, 12).reshape(3, 4).requires_grad_()
        y, z = fn(x)
        (y.sum() + z.sum()).backward(retain_graph=True)
        z.sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_layer_norm_output_the_caller_writes_under_no_grad_still_backpropagates(backend):
    """A LayerNorm without weights returned, then scaled in place under no_grad (fuzz 451298).
    Eager's LayerNorm saves its input and statistics, not its output, and the backward runs.
    Its decomposed backward recomputes the normalized input; merged with the returned output
    as a common subexpression, the output was saved, and the caller's write failed the
    backward. A returned node is no longer the representative of another."""
    def fn(x, lin):
        return F.layer_norm(lin(x), x.shape[-1:])

    x = torch.randn(4, 5)
    lin0 = torch.nn.Linear(5, 5)
    lin1 = copy.deepcopy(lin0)
    y0, y1 = fn(x, lin0), engine.compile(fn, backend=backend)(x, lin1)
    with torch.no_grad():
        y0.mul_(-1)
        y1.mul_(-1)
    (y0 * torch.arange(5.0)).sum().backward()
    (y1 * torch.arange(5.0)).sum().backward()
    torch.testing.assert_close(y1, y0)
    torch.testing.assert_close(lin1.weight.grad, lin0.weight.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_returned_before_its_base_is_written_through_another_view_across_a_break(backend):
    """`t6 = t3.unsqueeze(0)`, then `t3[1:][mask] = 1`, a break at the 0-d mask (fuzz 375436).
    The graph returns t6 and t3[1:] (not t3): both are rebuilt as views of t3, kept as a
    hidden output. t3[1:] was rebuilt as a view of the graph's own tensor for t6 instead,
    outside that family: the write after the break never reached t6's gradient, and x got
    y's gradient where eager's is 0."""
    def fn(x, y):
        t3 = x * y
        t6 = t3.unsqueeze(0)
        t3[1:][y > 0] = 1
        return t6

    x0 = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    x1 = x0.detach().clone().requires_grad_()
    y = torch.tensor(0.7)
    fn(x0, y).sum().backward()
    engine.compile(fn, backend=backend)(x1, y).sum().backward()
    torch.testing.assert_close(x1.grad, x0.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_no_output_depends_on_leaves_its_history_alone(backend):
    """`t1 = lin(y)`, a break, y scaled in place, t1 used only for a value nobody returns
    (fuzz 375527, with x and y the same tensor). Eager's loss has no path to lin(y)'s
    backward, which saved y. The compiled node after the break took t1 as an input that
    requires grad, so the loss reached lin(y)'s node, whose saved y had been written: the
    backward raised. Such an input is now handed in detached."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 3)

    def fn(x, y):
        t1 = lin(y)
        engine.graph_break()
        x.t().mul_(6)
        t6 = torch.mm(t1, t1.t())
        t6.copy_(t6)
        return lin(x)

    compiled = engine.compile(fn, backend=backend)
    compiled(torch.randn(6, 3), torch.randn(6, 3)).sum().backward()     # x and y apart first
    x0 = torch.randn(6, 3)
    x1 = x0.clone()
    lin.weight.grad = None
    fn(x0, x0).sum().backward()
    expected = lin.weight.grad.clone()
    lin.weight.grad = None
    compiled(x1, x1).sum().backward()
    torch.testing.assert_close(lin.weight.grad, expected)
    torch.testing.assert_close(x1, x0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_from_a_graph_without_gradients_takes_a_write_that_requires_grad(backend):
    """A graph whose inputs need no gradient runs under no_grad; the view it returns
    (`t.diagonal()`) was marked as made there, and writing into it after a break with a
    value that requires grad raised ("a view was created in no_grad mode"), where eager's
    view, made with grad on, takes the write (fuzz 378473)."""
    def fn(x, y):
        d = (x * 2).softmax(-1).neg().diagonal()
        engine.graph_break()
        d.addcmul_(y, y, value=0.5)
        return d

    x = torch.randn(5, 5)
    y0 = torch.randn((), requires_grad=True)
    y1 = y0.detach().clone().requires_grad_()
    out0, out1 = fn(x, y0), engine.compile(fn, backend=backend)(x, y1)
    torch.testing.assert_close(out1, out0)
    out0.sum().backward()
    out1.sum().backward()
    torch.testing.assert_close(y1.grad, y0.grad)


class Forwarding(torch.nn.Module):
    """A module whose own __getattr__ answers names nn.Module's lookup does not (as PEFT's
    wrappers forward to the model they wrap)."""

    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(3, 3)

    def __getattr__(self, name):
        if name == "scale" and self.__dict__.get("scaled"):
            return 3.0
        if name == "weight":
            return self.inner.weight
        return super().__getattr__(name)

    def forward(self, x):
        y = x @ self.weight.t()
        return y * self.scale if hasattr(self, "scale") else y


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_module_with_its_own_getattr_is_read_through_it(backend):
    """The capture read a module's attributes as nn.Module does even when its class has its
    own __getattr__: `hasattr(self, "scale")` was False at every compile, after the module
    started answering it, and the result stayed the unscaled one."""
    m, x = Forwarding(), torch.randn(2, 3)
    f = engine.compile(lambda m, x: m(x), backend=backend)
    same(f(m, x), m(x))
    m.scaled = True
    same(f(m, x), m(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_norm_whose_output_is_unused_still_updates_its_running_stats_once_sizes_are_symbolic(backend):
    """Fuzz 928121. An int argument that changes makes the recompile symbolic, and ops then
    trace under the Python dispatcher, where batch_norm becomes `_native_batch_norm_legit`:
    its writes to the running stats bumped no version counter, so the op looked pure, its
    result was unused, and it was dropped with them; the running stats stayed stale."""
    torch.manual_seed(0)
    mine = torch.nn.Sequential(torch.nn.Linear(7, 7), torch.nn.BatchNorm1d(7))
    theirs = copy.deepcopy(mine)

    def fn(x, n, m):
        m(x)            # only its effect on the running stats is kept
        return None

    f = engine.compile(fn, backend=backend)
    for n in (2, 3, 4):
        x = torch.randn(10, 7)
        fn(x, n, theirs)
        f(x, n, mine)
        same(mine[1].running_mean, theirs[1].running_mean)
        same(mine[1].running_var, theirs[1].running_var)
        assert int(mine[1].num_batches_tracked) == int(theirs[1].num_batches_tracked)


def _scaled_after_a_break(x):
    t0 = torch.relu(torch.sin(x)) * 2
    t0.unsqueeze_(0)
    t1 = t0[0].lerp_(x, 0.5)         # t1: a view of t0
    engine.graph_break()
    t0.mul_(2)                       # a write into t1's base
    return t1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_view_output_the_compiler_laid_out_its_own_way_stays_a_view_of_its_base(backend):
    """Fuzz 931083. The graph before the break returns t0 and t1, a view of t0; the kernels
    gave t0 another stride on its size-1 dim than the trace, so t1 was handed out as the
    compiled buffer alone: the same memory, but no view of t0 for autograd. The forward
    value was right; the gradient missed the `mul_` after the break (half of eager's)."""
    f = engine.compile(_scaled_after_a_break, backend=backend)
    for shape, grad in (((3, 6, 7), False), ((3, 6, 7), True)):
        x = torch.randn(shape, requires_grad=grad)
        got, want = f(x), _scaled_after_a_break(x)
        same(got, want)
        if grad:
            (gx,) = torch.autograd.grad(got.sum(), x)
            (wx,) = torch.autograd.grad(want.sum(), x)
            same(gx, wx)
