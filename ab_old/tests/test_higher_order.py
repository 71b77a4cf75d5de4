"""Higher-order ops as users write them: torch.cond and the torch.func transforms (grad,
grad_and_value, vjp, jvp, jacrev, jacfwd, vmap, functional_call), compiled by the engine
on every backend and compared with eager (results and gradients), with graph counts beside
torch.compile's; and the functions that cannot be treated as pure, which break with a
reason and still give eager's result."""

import pytest
import torch
import torch.nn as nn
from torch.func import functional_call, grad, grad_and_value, jacfwd, jacrev, jvp, vjp, vmap

import engine
from compare_helpers import run_both, torch_graphs
from engine_helpers import fresh_engine  # noqa: F401 (autouse)

BACKENDS = ["eager", "aot_eager", "inductor"]


def node_names(fn, *args):
    """The targets of the call_function nodes of the engine's graphs of fn."""
    engine.reset()
    names = []

    def backend(gm, example_inputs):
        names.extend(getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
        return gm.forward
    engine.compile(fn, backend=backend)(*args)
    engine.reset()
    return names


def one_graph(r, fn, *args, torch_count=True):
    assert (r.graph_count, r.graph_break_count) == (1, 0), [b.reason for b in r.break_reasons]
    if torch_count:
        assert r.graph_count == len(torch_graphs(fn, *args))


# ---------------------------------------------------------------------- torch.cond


def cond_tensor_pred(x, y):
    def true_fn(a):
        return (a * y).sin()       # closes over the frame's tensor y: lifted as an operand

    def false_fn(a):
        return a.cos() - y
    return torch.cond(x.sum() > 0, true_fn, false_fn, (x,)) * 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_with_a_tensor_predicate_is_one_graph_with_both_branches(backend, sign):
    def inputs():
        return [sign * (torch.rand(4) + 0.5).requires_grad_(), torch.randn(4, requires_grad=True)]
    r = run_both(cond_tensor_pred, lambda: [t.detach().requires_grad_() for t in inputs()], (), backend)
    one_graph(r, cond_tensor_pred, *[t.detach() for t in inputs()])
    assert "cond" in node_names(cond_tensor_pred, *[t.detach() for t in inputs()])


def cond_python_pred(x):
    return torch.cond(x.shape[0] > 2, lambda a: a.sin(), lambda a: a.cos(), (x,)) + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_cond_with_a_python_predicate_traces_the_branch_it_picks(backend):
    r = run_both(cond_python_pred, lambda: [torch.randn(4, requires_grad=True)], (), backend)
    one_graph(r, cond_python_pred, torch.randn(4))
    names = node_names(cond_python_pred, torch.randn(4))
    assert "sin" in names and "cos" not in names and "cond" not in names


# ---------------------------------------------------------------------- torch.func


def loss_fn(w, x):
    return ((x @ w).tanh() ** 2).mean()


def func_grad(w, x):
    g = grad(loss_fn)(w, x)
    gx = grad(loss_fn, argnums=1)(w, x)
    return g * 2, gx


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_is_one_node_and_differentiable(backend):
    r = run_both(func_grad, lambda: [torch.randn(3, 2, requires_grad=True), torch.randn(5, 3)], (), backend)
    one_graph(r, func_grad, torch.randn(3, 2), torch.randn(5, 3))
    assert node_names(func_grad, torch.randn(3, 2), torch.randn(5, 3)).count("func_grad") == 2


def grad_of_closure(w, x, y):
    # a nested function over the frame's tensors x and y: they become arguments of the node,
    # so the outer gradient reaches x through torch.func.grad
    def loss(w):
        return ((x @ w - y) ** 2).mean()
    return grad(loss)(w)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_of_a_closure_over_the_frames_tensors(backend):
    r = run_both(grad_of_closure, lambda: [torch.randn(3, requires_grad=True), torch.randn(4, 3, requires_grad=True),
                                           torch.randn(4)], (), backend)
    one_graph(r, grad_of_closure, torch.randn(3), torch.randn(4, 3), torch.randn(4))


def loss_with_aux(w, x):
    y = x @ w
    return y.pow(2).sum(), y.detach().abs().max()


def func_grad_and_value(w, x):
    g, (value, aux) = grad_and_value(loss_with_aux, has_aux=True)(w, x)
    return g, value, aux


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_and_value_with_aux(backend):
    r = run_both(func_grad_and_value, lambda: [torch.randn(3, requires_grad=True), torch.randn(4, 3)], (), backend)
    one_graph(r, func_grad_and_value, torch.randn(3), torch.randn(4, 3))


def func_vjp(x, ct):
    out, vjp_fn = vjp(lambda a: a.sin() * a, x)
    (gx,) = vjp_fn(ct)
    return out, gx


@pytest.mark.parametrize("backend", BACKENDS)
def test_vjp_and_its_vjp_fn(backend):
    r = run_both(func_vjp, lambda: [torch.randn(5, requires_grad=True), torch.randn(5)], (), backend)
    one_graph(r, func_vjp, torch.randn(5), torch.randn(5))


def func_vjp_random(x, ct):
    out, vjp_fn = vjp(lambda a: torch.nn.functional.dropout(a, 0.5) * a, x)
    return out, vjp_fn(ct)[0]


def test_vjp_of_a_random_function_breaks():
    # the compiled vjp runs f twice (its output, then vjp_fn): random ops would differ
    r = engine.explain(func_vjp_random)(torch.randn(5), torch.randn(5))
    assert any("random ops" in b.reason for b in r.break_reasons)
    torch.manual_seed(1)
    x, ct = torch.randn(5), torch.randn(5)
    torch.manual_seed(2)
    expected = func_vjp_random(x, ct)
    torch.manual_seed(2)
    got = engine.compile(func_vjp_random, backend="eager")(x, ct)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def func_jvp(x, t):
    out, tangent = jvp(lambda a: (a.exp() * a).sum(0), (x,), (t,))
    return out, tangent


@pytest.mark.parametrize("backend", BACKENDS)
def test_jvp(backend):
    r = run_both(func_jvp, lambda: [torch.randn(3, 2, requires_grad=True), torch.randn(3, 2)], (), backend)
    one_graph(r, func_jvp, torch.randn(3, 2), torch.randn(3, 2))


def func_jacobians(x):
    f = lambda a: a.sin() * a.sum()   # noqa: E731
    return jacrev(f)(x), jacfwd(f)(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_jacrev_and_jacfwd(backend):
    r = run_both(func_jacobians, lambda: [torch.randn(4, requires_grad=True)], (), backend)
    one_graph(r, func_jacobians, torch.randn(4))
    assert node_names(func_jacobians, torch.randn(4))[:2] == ["func_jacrev", "func_jacfwd"]


def func_vmap(x, w):
    batched = vmap(lambda a, b: (a * b).sum(), in_dims=(0, None))(x, w)
    per_sample = vmap(grad(loss_fn), in_dims=(None, 0))(w.unsqueeze(-1), x.unsqueeze(1))  # per-sample gradients
    return batched, per_sample, torch.vmap(torch.dot)(x, x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_with_in_dims_and_per_sample_grads(backend):
    r = run_both(func_vmap, lambda: [torch.randn(6, 3, requires_grad=True), torch.randn(3, requires_grad=True)], (),
                 backend)
    one_graph(r, func_vmap, torch.randn(6, 3), torch.randn(3))


linear = nn.Linear(4, 3)


def func_functional_call(x, weight):
    out = functional_call(linear, {"weight": weight}, (x,))   # the bias is the module's own
    return out, functional_call(linear, dict(linear.named_parameters()), x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_call_on_linear_with_a_params_dict(backend):
    r = run_both(func_functional_call, lambda: [torch.randn(2, 4), torch.randn(3, 4, requires_grad=True)],
                 [linear.weight, linear.bias], backend)
    one_graph(r, func_functional_call, torch.randn(2, 4), torch.randn(3, 4))


SCALE = 2.0


def scaled(x):
    return (x * SCALE).sin().sum()


def func_grad_of_scaled(x):
    return grad(scaled)(x)


def test_a_global_constant_the_function_reads_is_guarded():
    global SCALE
    x = torch.randn(3)
    compiled = engine.compile(func_grad_of_scaled, backend="aot_eager")
    torch.testing.assert_close(compiled(x), func_grad_of_scaled(x))
    SCALE = 3.0
    try:
        torch.testing.assert_close(compiled(x), func_grad_of_scaled(x))
    finally:
        SCALE = 2.0


# ---------------------------------------------------------------------- refused: break with a reason

W = torch.randn(3, requires_grad=True)


def reads_w(x):
    return (x * W).sum()


def func_grad_reads_global_tensor(x):
    return grad(reads_w)(x) * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_of_a_function_reading_a_global_tensor_breaks_with_a_reason(backend):
    r = run_both(func_grad_reads_global_tensor, lambda: [torch.randn(3, requires_grad=True)], [W], backend)
    reasons = [b.reason for b in r.break_reasons]
    assert any("torch.func.grad of a function that reads the global tensor W" in s for s in reasons), reasons
    assert r.graph_count == 1    # the `* 2` after the eager call


model = nn.Linear(3, 3)


def vmap_of_a_module(x):
    return vmap(model)(x)


def test_vmap_of_a_module_with_parameters_breaks_and_says_functional_call():
    r = engine.explain(vmap_of_a_module)(torch.randn(2, 3))
    assert any("functional_call" in b.reason for b in r.break_reasons)
    x = torch.randn(2, 3)
    torch.testing.assert_close(engine.compile(vmap_of_a_module, backend="aot_eager")(x), vmap_of_a_module(x))


def prints(x):
    print("inside")
    return x.sum()


def func_grad_of_print(x):
    return grad(prints)(x)


def test_a_function_with_side_effects_breaks(capsys):
    r = engine.explain(func_grad_of_print)(torch.randn(3))
    assert any("print" in b.reason for b in r.break_reasons)


def apply_grad(f, x):
    return grad(f)(x)


def test_the_function_passed_in_is_guarded_by_identity():
    compiled = engine.compile(apply_grad, backend="aot_eager")
    x = torch.randn(4)
    for f in (lambda a: a.sin().sum(), lambda a: a.cos().sum(), lambda a: a.sin().sum()):
        torch.testing.assert_close(compiled(f, x), apply_grad(f, x))


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = 2.0

    def forward(self, x):
        return self.lin(x) * self.scale


scaled_model = Scaled()


def call_scaled(x, params):
    return functional_call(scaled_model, params, (x,))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_functional_call_guards_the_modules_attributes(backend):
    params = {k: v.detach().clone() for k, v in scaled_model.named_parameters()}
    compiled = engine.compile(call_scaled, backend=backend)
    x = torch.randn(2, 3)
    torch.testing.assert_close(compiled(x, params), call_scaled(x, params))
    scaled_model.scale = 5.0
    try:
        torch.testing.assert_close(compiled(x, params), call_scaled(x, params))
    finally:
        scaled_model.scale = 2.0


def vjp_after_inplace(x, ct):
    x = x.clone()
    out, vjp_fn = vjp(lambda a: a.sin() * a, x)
    x.mul_(2)
    return out, vjp_fn(ct)[0]


def test_vjp_fn_after_an_in_place_change_of_a_primal_is_not_recomputed():
    r = engine.explain(vjp_after_inplace)(torch.randn(3), torch.randn(3))
    assert any("modified in place" in b.reason for b in r.break_reasons), [b.reason for b in r.break_reasons]


def grad_over_a_list(x, y):
    ys = [y, y * 2]
    return grad(lambda a: (a * ys[0] * ys[1]).sum())(x)


def test_a_closure_over_a_list_breaks_with_a_reason_and_eagers_result():
    x, y = torch.randn(3), torch.randn(3)
    r = engine.explain(grad_over_a_list)(x, y)
    assert any("torch.func.grad of a function that closes over ys" in b.reason for b in r.break_reasons)
    torch.testing.assert_close(engine.compile(grad_over_a_list, backend="aot_eager")(x, y), grad_over_a_list(x, y))


# ---------------------------------------------------------------------- associative_scan

from torch._higher_order_ops.associative_scan import associative_scan  # noqa: E402


def _selective_scan(a, b):
    """Mamba's recurrence h[t] = a[t] * h[t-1] + b[t], as transformers writes it under compile."""
    def combine(left, right):
        return left[0] * right[0], right[0] * left[1] + right[1]
    return associative_scan(combine, (a, b), dim=1, combine_mode="generic")[1]


def _cumprod_reversed(x):
    return associative_scan(lambda p, q: p * q, x, dim=0, reverse=True, combine_mode="generic")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,shape", [(_selective_scan, (2, 7, 3)), (_selective_scan, (2, 8, 3)),
                                      (_cumprod_reversed, (5, 4)), (_cumprod_reversed, (1, 4))],
                         ids=["mamba_odd", "mamba_even", "cumprod_reverse", "length_one"])
def test_associative_scan_is_traced_into_one_graph(fn, shape, backend):
    """torch's associative_scan (a higher-order op) is traced as the parallel prefix it
    computes, with eager's values (eager runs torch's own implementation) and gradients."""
    def inputs():
        a = torch.rand(*shape, requires_grad=True)
        return (a, torch.randn(*shape, requires_grad=True)) if fn is _selective_scan else (a,)
    r = run_both(fn, inputs, backend=backend, tol=dict(rtol=1e-5, atol=1e-6))
    one_graph(r, fn, *inputs(), torch_count=False)


def test_associative_scan_matches_the_sequential_recurrence():
    a, b = torch.rand(2, 9, 3), torch.randn(2, 9, 3)
    h, want = torch.zeros(2, 3), []
    for t in range(9):
        h = a[:, t] * h + b[:, t]
        want.append(h)
    got = engine.compile(_selective_scan)(a, b)
    torch.testing.assert_close(got, torch.stack(want, 1), rtol=1e-5, atol=1e-6)
