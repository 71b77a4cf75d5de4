"""`loss.backward()` inside a compiled function: traced into the graph (forward and backward
compiled as one), with eager's gradients, `.grad` objects and layouts; and, where it cannot
be, left to autograd with the reason on the graph-break log."""

import copy

import pytest
import torch
import torch.nn as nn

import engine
from engine_helpers import fresh_engine  # noqa: F401 (fresh_engine: autouse)
from test_training import OPTIMIZERS

BACKENDS = ["eager", "aot_eager", "inductor"]


@pytest.fixture(autouse=True)
def backward_in_graph():
    with engine.config.patch(backward_in_graph=True):
        yield


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))


def twins(optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2)):
    """The model twice, eager's and ours, each with its own optimizer."""
    eager_m = make_model()
    ours_m = copy.deepcopy(eager_m)
    return eager_m, ours_m, optimizer(eager_m.parameters()), optimizer(ours_m.parameters())


def train_step(model, opt, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)) for _ in range(n)]


def break_reasons(fn, *args):
    return [b.reason for b in engine.explain(fn)(*args).break_reasons]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_training_step_with_its_backward_in_the_graph_matches_eager(backend):
    eager_m, ours_m, eager_opt, ours_opt = twins()
    step = engine.compile(train_step, backend=backend)
    for x, y in batches(4):
        want = train_step(eager_m, eager_opt, x, y)
        got = step(ours_m, ours_opt, x, y)
        torch.testing.assert_close(got, want.detach())
    for a, b in zip(ours_m.parameters(), eager_m.parameters()):
        torch.testing.assert_close(a, b)
        assert a.grad is None and b.grad is None
    # the backward is not a graph break: forward and backward are one graph
    assert not any("backward" in r for r in break_reasons(train_step, ours_m, ours_opt, *batches(1)[0]))
    # the loss comes back detached: autograd's graph behind it is spent
    assert not got.requires_grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind, options", OPTIMIZERS, ids=[f"{k}-{'-'.join(o)}" for k, o in OPTIMIZERS])
def test_the_whole_step_forward_backward_update_and_zeroing_is_one_graph(backend, kind, options):
    """After a backward in the graph, `opt.step()` and `opt.zero_grad()` are traced into the
    same graph: one graph per step, no break; parameters, optimizer state and `.grad`s as
    eager's after every step."""
    eager_m, ours_m, eager_opt, ours_opt = twins(lambda ps: getattr(torch.optim, kind)(ps, **options))
    step = engine.compile(train_step, backend=backend)
    for x, y in batches(3):
        torch.testing.assert_close(step(ours_m, ours_opt, x, y), train_step(eager_m, eager_opt, x, y).detach())
        for a, b in zip(ours_m.parameters(), eager_m.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            assert a.grad is None and b.grad is None
            for key, value in eager_opt.state[b].items():
                # (centered RMSprop divides by a near-zero variance: its momentum is far larger than its step)
                torch.testing.assert_close(ours_opt.state[a][key], value, rtol=1e-4, atol=1e-5)
    report = engine.explain(train_step)(ours_m, ours_opt, *batches(1)[0])
    assert (report.graph_count, report.break_reasons) == (1, [])


def clipped_step(model, opt, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    opt.step()
    opt.zero_grad()
    return loss, norm


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("backward_in_graph", [True, False])
def test_gradient_clipping_is_traced_between_the_backward_and_the_step(backend, backward_in_graph):
    """clip_grad_norm_ (foreach norms of the new `.grad`s, then an in-place scale): traced,
    with the backward in the graph into the step's one graph; with it left to autograd, into
    the graph after the backward's break. The norm and the clipped updates are eager's."""
    eager_m, ours_m, eager_opt, ours_opt = twins()
    with engine.config.patch(backward_in_graph=backward_in_graph):
        step = engine.compile(clipped_step, backend=backend)
        for x, y in batches(3):
            got, want = step(ours_m, ours_opt, x, y), clipped_step(eager_m, eager_opt, x, y)
            torch.testing.assert_close(got, tuple(t.detach() for t in want))
            assert want[1] > 0.05      # the clipping changes the step
        for a, b in zip(ours_m.parameters(), eager_m.parameters()):
            torch.testing.assert_close(a, b)
        reasons = break_reasons(clipped_step, ours_m, ours_opt, *batches(1)[0])   # (one more step)
    assert not any("clip_grad" in r for r in reasons), reasons
    assert reasons == [] if backward_in_graph else len(reasons) == 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(6))
def test_random_training_steps_match_eager(backend, seed):
    """tests/fuzz/training_steps.py: a random model, optimizer, param groups, frozen
    parameters, micro-batches, clipping and zero_grad (`python -m tests.fuzz.training_steps`
    runs more seeds)."""
    from fuzz.training_steps import check
    check(seed + 7000, backend, OPTIMIZERS)


def step_keeping_zeroed_grads(model, opt, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    return loss


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_optimizer_step_traced_after_the_backward_may_keep_its_grads(backend):
    """zero_grad(set_to_none=False) stays eager (a break after the step): the `.grad`s the
    graph made are written back, then zeroed in place, as eager's are."""
    eager_m, ours_m, eager_opt, ours_opt = twins()
    step = engine.compile(step_keeping_zeroed_grads, backend=backend)
    for x, y in batches(3):
        step(ours_m, ours_opt, x, y)
        step_keeping_zeroed_grads(eager_m, eager_opt, x, y)
    for a, b in zip(ours_m.parameters(), eager_m.parameters()):
        torch.testing.assert_close(a, b)
        assert a.grad is not None and not a.grad.any() and b.grad is not None
    reasons = break_reasons(step_keeping_zeroed_grads, ours_m, ours_opt, *batches(1)[0])
    assert len(reasons) == 1 and "zero_grad" in reasons[0]


@pytest.mark.parametrize("kind", ["hook", "scheduler, float lr", "scheduler, tensor lr"])
def test_an_optimizer_with_step_hooks_or_a_scheduler_wrapping_its_step(kind):
    """A step hook keeps `opt.step()` a break (the hook runs eagerly, once per step). An LR
    scheduler's wrapper of `opt.step` is traced through when lr is a tensor (one graph, no
    recompile as lr changes); with a float lr, which each new value would recompile the whole
    graph for, the step stays a break that says so. All match eager."""
    eager_m = make_model()
    ours_m = copy.deepcopy(eager_m)
    lr = (lambda: torch.tensor(1e-2)) if kind.endswith("tensor lr") else (lambda: 1e-2)
    opts = [torch.optim.AdamW(m.parameters(), lr=lr()) for m in (eager_m, ours_m)]
    calls, scheds = [], []
    for o in opts:
        if kind == "hook":
            o.register_step_pre_hook(lambda opt, args, kwargs: calls.append(opt))
        else:
            scheds.append(torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5))
    step = engine.compile(train_step)
    for x, y in batches(3):
        torch.testing.assert_close(step(ours_m, opts[1], x, y), train_step(eager_m, opts[0], x, y).detach())
        for s in scheds:
            s.step()
    for a, b in zip(ours_m.parameters(), eager_m.parameters()):
        torch.testing.assert_close(a, b)
    report = engine.explain(train_step)(ours_m, opts[1], *batches(1)[0])
    reasons = [b.reason for b in report.break_reasons]
    if kind == "hook":
        assert [o is opts[1] for o in calls] == [True, False] * 3 + [True]   # ours runs first in each pair
        assert len(reasons) == 1 and "step hooks or arguments: the step runs eagerly" in reasons[0]
    elif kind == "scheduler, float lr":
        assert len(reasons) == 1 and "LR scheduler changing its float lr" in reasons[0], reasons
    else:
        assert (report.graph_count, reasons) == (1, []) and opts[1]._opt_called


def accumulate(model, x, y):
    loss = nn.functional.cross_entropy(model(x), y) / 2
    loss.backward()
    return loss


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_accumulate_into_the_existing_grad_in_place(backend):
    eager_m = make_model()
    ours_m = copy.deepcopy(eager_m)
    fn = engine.compile(accumulate, backend=backend)
    (x0, y0), (x1, y1), (x2, y2) = batches(3)
    accumulate(eager_m, x0, y0)
    fn(ours_m, x0, y0)                      # first: .grad is None, the gradient becomes it
    first = [p.grad for p in ours_m.parameters()]
    for x, y in ((x1, y1), (x2, y2)):       # then: added into the same tensors, as AccumulateGrad does
        accumulate(eager_m, x, y)
        fn(ours_m, x, y)
    for a, b, g in zip(ours_m.parameters(), eager_m.parameters(), first):
        torch.testing.assert_close(a.grad, b.grad)
        assert a.grad is g


class Transposed(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w = nn.Parameter(torch.randn(5, 3).t())     # strides (1, 3): not contiguous
        self.b = nn.Parameter(torch.randn(5))

    def forward(self, x):
        return (x @ self.w + self.b).tanh().sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_first_gradient_takes_its_parameters_strides(backend):
    eager_m = Transposed()
    ours_m = copy.deepcopy(eager_m)
    x = torch.randn(4, 3)

    def step(m, x):
        m(x).backward()

    step(eager_m, x)
    engine.compile(step, backend=backend)(ours_m, x)
    torch.testing.assert_close(ours_m.w.grad, eager_m.w.grad)
    assert ours_m.w.grad.stride() == eager_m.w.grad.stride() == (1, 3)


def eager_and_compiled(fn, backend):
    """fn on one batch, eagerly and compiled, each on its own copy of the model:
    (eager's result, the compiled result, eager's model, the compiled one's, the batch)."""
    eager_m = make_model()
    ours_m = copy.deepcopy(eager_m)
    x, y = batches(1)[0]
    return fn(eager_m, x, y), engine.compile(fn, backend=backend)(ours_m, x, y), eager_m, ours_m, (x, y)


def grad_norm_after_backward(model, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    norm = torch.stack([p.grad.norm() for p in model.parameters()]).norm()
    for p in model.parameters():
        p.grad = None
    return loss, norm


@pytest.mark.parametrize("backend", BACKENDS)
def test_grads_read_and_cleared_after_the_backward_in_the_same_graph(backend):
    want, got, _, ours_m, batch = eager_and_compiled(grad_norm_after_backward, backend)
    torch.testing.assert_close(got[1], want[1])
    assert all(p.grad is None for p in ours_m.parameters())
    assert break_reasons(grad_norm_after_backward, ours_m, *batch) == []


def backward_then_forward(model, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return model(x)          # a new forward: its result needs autograd after the frame


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_result_that_still_needs_autograd_leaves_the_backward_to_autograd(backend):
    want, got, eager_m, ours_m, batch = eager_and_compiled(backward_then_forward, backend)
    torch.testing.assert_close(got, want)
    assert got.requires_grad          # as eager's: a later backward through it works
    got.sum().backward()
    want.sum().backward()
    for a, b in zip(ours_m.parameters(), eager_m.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    reasons = break_reasons(backward_then_forward, ours_m, *batch)
    assert any("Tensor.backward()" in r and "still needs autograd" in r for r in reasons), reasons


def retain_graph(model, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward(retain_graph=True)
    return loss


def with_hook(model, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss


def test_backwards_left_to_autograd_say_why():
    model = make_model()
    x, y = batches(1)[0]
    assert any("retain_graph argument" in r for r in break_reasons(retain_graph, model, x, y))
    handle = model[0].weight.register_hook(lambda g: g * 2)
    try:
        reasons = break_reasons(with_hook, model, x, y)
        assert any("hooks on" in r and "weight" in r for r in reasons), reasons
        eager_m = copy.deepcopy(model)
        eager_m[0].weight.register_hook(lambda g: g * 2)
        with_hook(eager_m, x, y)
        engine.reset()
        model.zero_grad()
        engine.compile(with_hook)(model, x, y)       # the hook ran: eager's doubled gradient
        torch.testing.assert_close(model[0].weight.grad, eager_m[0].weight.grad)
    finally:
        handle.remove()


def test_off_by_default_the_break_says_how_to_turn_it_on():
    model = make_model()
    x, y = batches(1)[0]
    with engine.config.patch(backward_in_graph=False):
        reasons = break_reasons(accumulate, model, x, y)
    assert any("backward_in_graph is off" in r for r in reasons), reasons


def test_off_zero_grad_is_still_traced_and_the_step_compiles_apart():
    """With the backward left to autograd, the step is a break (its inner step a graph of its
    own) and `opt.zero_grad()` sets each `.grad` to None from generated code, no break."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with engine.config.patch(backward_in_graph=False):
        engine.compile(train_step)(model, opt, *batches(1)[0])
        reasons = break_reasons(train_step, model, opt, *batches(1)[0])
    assert len(reasons) == 2 and "backward" in reasons[0] and "step" in reasons[1], reasons
    assert all(p.grad is None for p in model.parameters()) and len(opt.state) == 6   # 3 layers: weights, biases


def test_the_joined_graph_peaks_no_higher_than_the_partitioned_pair():
    """Forward and backward in one graph keep what the min-cut partitioner would save, not
    every forward value the backward reads (the bf16 casts of the weights, the GELUs'
    inputs are recomputed after the loss's tangent), and the code generator fuses nothing
    across the tangent. Without either, this step peaks 1.7% above the pair's."""
    from codegen_helpers import peak_bytes

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 256))
    x = torch.randn(64, 256)

    def step(m, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(x).float().square().mean()
        loss.backward()
        return loss

    def peak(in_graph):
        engine.reset()
        m = copy.deepcopy(model)
        with engine.config.patch(backward_in_graph=in_graph):
            fn = engine.compile(step, backend="inductor")
            for _ in range(2):
                m.zero_grad(set_to_none=True)
                fn(m, x)
            m.zero_grad(set_to_none=True)
            return peak_bytes(lambda: fn(m, x))

    assert peak(True) <= peak(False) * 1.01


def test_a_whole_step_in_one_graph_peaks_no_higher_than_the_step_in_three():
    """Forward, backward, AdamW and zero_grad in one graph: each weight, read by the matmuls
    of the forward and backward, is updated in its own memory (not in a new buffer copied
    back after the graph, a copy of every weight alive at once), and the gradients the step
    consumes never become `.grad`s."""
    from codegen_helpers import peak_bytes

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 256))
    x = torch.randn(64, 256)

    def step(m, o, x):
        loss = m(x).square().mean()
        loss.backward()
        o.step()
        o.zero_grad()
        return loss

    def peak(in_graph):
        engine.reset()
        m = copy.deepcopy(model)
        o = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True)
        with engine.config.patch(backward_in_graph=in_graph):
            fn = engine.compile(step, backend="inductor")
            for _ in range(2):
                fn(m, o, x)
            return peak_bytes(lambda: fn(m, o, x))

    joined, split = peak(True), peak(False)
    assert joined <= split, (joined, split)


def test_fullgraph_compiles_a_forward_and_backward_and_names_the_line_when_it_cannot():
    model = make_model()
    x, y = batches(1)[0]
    engine.compile(accumulate, fullgraph=True)(model, x, y)      # one graph: no break at the backward
    assert all(p.grad is not None for p in model.parameters())
    engine.reset()
    with engine.config.patch(backward_in_graph=False), pytest.raises(engine.Unsupported) as err:
        engine.compile(accumulate, fullgraph=True)(model, x, y)
    assert "loss.backward()" in str(err.value) and "backward_in_graph is off" in str(err.value)
