"""Training as users write it: mixed precision, custom autograd Functions, activation
checkpointing and optimizer steps, compiled by the engine on every backend and compared
with eager (results and gradients), with graph counts beside torch.compile's."""

import copy

import pytest
import torch
import torch.nn as nn

import engine
from compare_helpers import run_both, torch_graphs
from engine_helpers import events, fresh_engine  # noqa: F401 (fresh_engine: autouse)

BACKENDS = ["eager", "aot_eager", "inductor"]


# bf16 rounding differs where eager sums two gradient contributions in bf16 (one cached
# cast of a weight) and a split graph casts twice
BF16 = dict(rtol=2e-2, atol=2e-2)

# ---------------------------------------------------------------------- autocast

lin = nn.Linear(8, 8)


def autocast_block(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x).relu()
        with torch.autocast("cpu", enabled=False):   # a float32 island inside
            z = y.float() @ lin.weight
    return y.float() * 2, z, y.dtype


@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_regions_trace_into_one_graph_with_eagers_dtypes(backend):
    r = run_both(autocast_block, lambda: [torch.randn(4, 8, requires_grad=True)], [lin.weight], backend, BF16)
    assert (r.graph_count, r.graph_break_count) == (1, 0)
    assert r.graph_count <= len(torch_graphs(autocast_block, torch.randn(4, 8)))


def autocast_with_a_break(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x).relu()
        print("inside autocast:", torch.is_autocast_enabled("cpu"))  # a graph break inside the block
        z = lin(y)                                                    # still bf16 after the break
    return y.float() * 2, z, z.float().sigmoid()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_break_inside_autocast_resumes_inside_it(backend, capsys):
    r = run_both(autocast_with_a_break, lambda: [torch.randn(4, 8, requires_grad=True)], [lin.weight], backend,
                 BF16)
    assert (r.graph_count, r.graph_break_count) == (2, 1)
    # the print ran with autocast on, in every call (eager and compiled alike)
    assert "inside autocast: False" not in capsys.readouterr().out


@torch.autocast("cpu", dtype=torch.bfloat16)
def autocast_decorated(x):
    return lin(x) * 3


class AmpModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    @torch.amp.autocast("cpu")
    def forward(self, x):
        return self.lin(x).sigmoid()


amp_module = AmpModule()


def legacy_spelling(x):
    with torch.cpu.amp.autocast():
        return amp_module(x) + lin(x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [autocast_decorated, legacy_spelling], ids=["decorator", "method-decorator"])
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_autocast_as_a_decorator_and_in_its_older_spellings(fn, backend):
    r = run_both(fn, lambda: [torch.randn(4, 8, requires_grad=True)], [lin.weight], backend, BF16)
    assert (r.graph_count, r.graph_break_count) == (1, 0)


def float32_island(x):
    with torch.autocast("cpu", enabled=False):
        return (x @ lin.weight).sum(-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_compiled_function_called_inside_autocast_keeps_its_own_float32_block(backend):
    engine.reset()
    compiled = engine.compile(float32_island, backend=backend)
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = float32_island(x)
        got = compiled(x)
        again = compiled(x)
    assert got.dtype == again.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(got, expected)


# ---------------------------------------------------------------------- torch.autograd.Function


class ScaledSquare(torch.autograd.Function):
    """save_for_backward, an attribute on ctx, a constant argument, needs_input_grad."""

    @staticmethod
    def forward(ctx, x, w, k):
        ctx.save_for_backward(x, w)
        ctx.k = k
        return x * x * w * k

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g * 2 * x * w * ctx.k if ctx.needs_input_grad[0] else None
        gw = (g * x * x * ctx.k).sum(0) if ctx.needs_input_grad[1] else None
        return gx, gw, None


class StraightThrough(torch.autograd.Function):
    """A gradient eager autograd would not give (round's gradient is zero): the user's backward must be used."""

    @staticmethod
    def forward(x):
        return x.round()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        return g * 1.0


class SortWithIndices(torch.autograd.Function):
    """Two outputs, one of them not differentiable."""

    @staticmethod
    def forward(ctx, x):
        values, idx = x.sort(-1)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(idx)
        return values, idx

    @staticmethod
    def backward(ctx, gv, gi):
        idx, = ctx.saved_tensors
        return torch.zeros_like(gv).scatter(-1, idx, gv)


class AddOneInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.add_(1)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


w_param = nn.Parameter(torch.randn(8))


def uses_functions(x):
    y = ScaledSquare.apply(x.sin(), w_param, 3.0)
    v, i = SortWithIndices.apply(y)
    z = StraightThrough.apply(v * 4)
    return AddOneInPlace.apply(z.clone()).cos(), i


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_functions_are_one_graph_with_the_users_backward(backend):
    r = run_both(uses_functions, lambda: [torch.randn(4, 8, requires_grad=True)], [w_param], backend)
    assert (r.graph_count, r.graph_break_count) == (1, 0)
    assert r.graph_count <= len(torch_graphs(uses_functions, torch.randn(4, 8, requires_grad=True)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_function_without_grad_inputs(backend):
    run_both(uses_functions, lambda: [torch.randn(4, 8)], [], backend)


class BranchesOnData(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2 if x.sum() > 0 else x * 3

    @staticmethod
    def backward(ctx, g):
        return g


class BadBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("this backward is broken")


def branches(x):
    return BranchesOnData.apply(x.sin()).cos()


def bad_backward(x):
    return BadBackward.apply(x.sin()).cos()


@pytest.mark.parametrize("fn, why", [(branches, "BranchesOnData"), (bad_backward, "backward of autograd.Function BadBackward")])
def test_a_function_that_cannot_be_traced_breaks_with_its_name(fn, why):
    x = torch.randn(4, requires_grad=True)
    engine.reset()
    r = engine.explain(fn)(x)
    assert r.graph_break_count >= 1
    assert any(why in str(b.reason) for b in r.break_reasons), [str(b.reason) for b in r.break_reasons]
    if fn is branches:
        run_both(fn, lambda: [torch.randn(4, requires_grad=True)], [], "aot_eager")


# ---------------------------------------------------------------------- activation checkpointing

from torch.utils.checkpoint import checkpoint, checkpoint_sequential  # noqa: E402

block = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 16))


def no_checkpoint(x):
    return block(x).sin()


def checkpointed(x):
    return checkpoint(block, x, use_reentrant=False).sin()


def checkpointed_sequential(x):
    return checkpoint_sequential(block, 2, x, use_reentrant=False).sin()


def activation_bytes(fn, x):
    """Bytes of non-parameter tensors the call saves for its backward (second call: the
    first one compiles, and tracing saves fake tensors too)."""
    params = {p.data_ptr() for p in block.parameters()}
    total = [0]

    def pack(t):
        if t.data_ptr() not in params and t.data_ptr() != x.data_ptr():
            total[0] += t.numel() * t.element_size()
        return t

    fn(x)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return total[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [checkpointed, checkpointed_sequential])
def test_checkpointed_code_compiles_into_the_graph(fn, backend):
    r = run_both(fn, lambda: [torch.randn(8, 16, requires_grad=True)], list(block.parameters()), backend)
    assert (r.graph_count, r.graph_break_count) == (1, 0)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_backward_recomputes_a_checkpointed_block_instead_of_saving_it(backend):
    x = torch.randn(8, 16, requires_grad=True)
    engine.reset()
    plain = activation_bytes(engine.compile(no_checkpoint, backend=backend), x)
    engine.reset()
    ckpt = activation_bytes(engine.compile(checkpointed, backend=backend), x)
    engine.reset()
    seq = activation_bytes(engine.compile(checkpointed_sequential, backend=backend), x)
    # without checkpointing the block's hidden activations (8x64 floats each) are saved (the
    # min-cut recomputes the GELUs from the Linears' outputs); with it, none of them (only what
    # sin() needs after the block); with two segments, the last segment's
    assert plain >= 2 * 8 * 64 * 4
    assert ckpt <= 8 * 16 * 4
    assert ckpt < seq < plain


def reentrant(x):
    return checkpoint(block, x, use_reentrant=True).sin()


def test_the_reentrant_form_breaks_and_says_how_to_compile_it():
    engine.reset()
    r = engine.explain(reentrant)(torch.randn(8, 16, requires_grad=True))
    assert any("use_reentrant=False" in str(b.reason) for b in r.break_reasons)
    x = torch.randn(8, 16, requires_grad=True)
    engine.reset()
    got = engine.compile(reentrant, backend="aot_eager")(x)
    torch.testing.assert_close(got, reentrant(x))
    got.sum().backward()   # the reentrant form supports .backward() only (not autograd.grad)
    assert x.grad is not None


# ---------------------------------------------------------------------- optimizer steps


OPTIMIZERS = [
    ("SGD", dict(lr=0.1)), ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.1, momentum=0.9, foreach=True)), ("Adam", dict(lr=1e-2)),
    ("Adam", dict(lr=1e-2, amsgrad=True)), ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
    ("AdamW", dict(lr=1e-2, foreach=True)), ("RMSprop", dict(lr=1e-2)),
    ("RMSprop", dict(lr=1e-2, momentum=0.5, centered=True, foreach=True)), ("Adagrad", dict(lr=1e-2)),
    ("Adagrad", dict(lr=1e-2, foreach=True)), ("Adam", dict(lr=1e-2, foreach=True, amsgrad=True)),
    ("Adamax", dict(lr=1e-2)), ("NAdam", dict(lr=1e-2)), ("Adadelta", dict(lr=1e-2)),
    ("RAdam", dict(lr=1e-2)), ("RAdam", dict(lr=1e-2, foreach=True, decoupled_weight_decay=True, weight_decay=0.1)),
    ("ASGD", dict(lr=1e-2)), ("ASGD", dict(lr=1e-2, foreach=True)), ("Rprop", dict(lr=1e-2)),
    ("NAdam", dict(lr=1e-2, foreach=True, decoupled_weight_decay=True)),
]


def training_step(model, opt, x):
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind, options", OPTIMIZERS, ids=[f"{k}-{'-'.join(o)}" for k, o in OPTIMIZERS])
def test_optimizer_steps_compile_and_match_eager_step_by_step(kind, options, backend):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    twin = copy.deepcopy(model)
    opt = getattr(torch.optim, kind)(model.parameters(), **options)
    twin_opt = getattr(torch.optim, kind)(twin.parameters(), **options)
    engine.reset()
    compiled = engine.compile(training_step, backend=backend)
    for _ in range(3):
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(twin, twin_opt, x), training_step(model, opt, x))
        for a, b in zip(twin.parameters(), model.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for sa, sb in zip(twin_opt.state.values(), opt.state.values()):
        for k in sb:
            torch.testing.assert_close(sa[k], sb[k], rtol=1e-5, atol=1e-6)
    # the inner step is one graph: the only break is the opt.step() call itself
    engine.reset()
    twin(torch.randn(4, 8)).sum().backward()
    r = engine.explain(lambda: twin_opt.step())()
    assert r.graph_count == 1 and len(r.break_reasons) == 1, [str(b.reason) for b in r.break_reasons]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_compiling_steps_gradients_are_freed_by_zero_grad(backend):
    # The capture kept the real tensors of the call that compiled (a Llama step's
    # gradients, 3 GiB): for good through the compiled graph's fake tensors, and until the
    # next garbage collection through its own reference cycles. Neither may hold them.
    import gc
    import weakref
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: seen.append(weakref.ref(p.grad)))
    compiled = engine.compile(training_step, backend=backend)
    gc.collect()
    gc.disable()
    try:
        compiled(model, opt, torch.randn(4, 8))
        assert len(seen) == 4 and all(p.grad is None for p in model.parameters())
        assert [r() for r in seen if r() is not None] == []
    finally:
        gc.enable()


@pytest.mark.parametrize("kind", ["AdamW", "RAdam", "ASGD"])
def test_compiling_opt_step_itself_compiles_its_inner_step(kind):
    model = nn.Linear(8, 8)
    opt = getattr(torch.optim, kind)(model.parameters(), lr=1e-2)
    model(torch.randn(2, 8)).sum().backward()
    e = engine.explain(opt.step)()         # torch.compile(opt.step) is a documented recipe
    assert e.graph_count == 1 and e.not_compiled == [] and e.break_reasons == []


def test_a_training_step_is_two_graphs_the_step_one_of_them_and_later_steps_reuse_them(events):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine.reset()
    r = engine.explain(training_step)(model, opt, torch.randn(4, 8))
    t_model = copy.deepcopy(model)
    t_opt = torch.optim.AdamW(t_model.parameters(), lr=1e-2)
    assert r.graph_count == len(torch_graphs(training_step, t_model, t_opt, torch.randn(4, 8))) == 2
    step_graph = r.graphs[1]
    assert sum(n.op == "call_function" for n in step_graph.graph.nodes) > 20   # the whole AdamW update
    engine.reset()
    compiled = engine.compile(training_step, backend="aot_eager")
    compiled(model, opt, torch.randn(4, 8))
    compiles = sum(e.name == "compilation_metrics" for e in events)
    for _ in range(3):
        compiled(model, opt, torch.randn(4, 8))
    assert sum(e.name == "compilation_metrics" for e in events) == compiles   # no recompile


def test_the_first_compiled_step_creates_the_state_eager_would():
    model = nn.Linear(4, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    engine.reset()
    model(torch.randn(2, 4)).sum().backward()
    engine.compile(lambda: opt.step(), backend="aot_eager")()
    assert set(opt.state[model.weight]) == {"step", "exp_avg", "exp_avg_sq"}
    assert float(opt.state[model.weight]["step"]) == 1.0


@pytest.mark.parametrize("backward_in_graph", [False, True])
def test_an_lr_scheduler_changing_a_tensor_lr_does_not_recompile(events, backward_in_graph, monkeypatch):
    """With the backward in the graph the step is traced through the scheduler's wrapper of
    `opt.step` (`func.__get__(opt)`, a new method object on every read: its guard is on the
    function it binds)."""
    monkeypatch.setattr(engine.config, "backward_in_graph", backward_in_graph)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    twin = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.01))
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=torch.tensor(0.01))
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (opt, twin_opt)]
    compiled = engine.compile(training_step, backend="aot_eager")
    compiles = None
    for _ in range(4):
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(twin, twin_opt, x), training_step(model, opt, x))
        compiles = compiles or sum(e.name == "compilation_metrics" for e in events)
        for s in scheds:
            s.step()
    assert float(twin_opt.param_groups[0]["lr"]) == pytest.approx(0.01 / 16)
    assert sum(e.name == "compilation_metrics" for e in events) == compiles


def test_a_grad_scaler_steps_around_a_compiled_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    twin = copy.deepcopy(model)
    compiled = engine.compile(twin, backend="aot_eager")
    runs = []
    for m, net in ((model, model), (twin, compiled)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        torch.manual_seed(1)
        losses = []
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = net(torch.randn(4, 8)).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            losses.append(loss.detach())
        runs.append(losses)
    torch.testing.assert_close(runs[1], runs[0], **BF16)
    for a, b in zip(twin.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, **BF16)


# ---------------------------------------------------------------------- a real model's whole step

@pytest.mark.parametrize("name", ["GPT2LMHeadModel", "LlamaForCausalLM"])
def test_a_zoo_models_whole_training_step_with_autocast_and_adamw_compiles_whole(name):
    pytest.importorskip("transformers")
    from tests.zoo import models
    from tests.bench.bench_train_step import make_step
    entry = models.ZOO[name]
    base, inputs = models.build(name, "train")
    step = make_step(entry, "cpu", torch.bfloat16)
    runs = []
    for compiled in (False, True):
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        engine.reset()
        fn = engine.compile(step, backend="aot_eager") if compiled else step
        losses = [fn(model, opt, inputs).detach() for _ in range(2)]
        runs.append((losses, model))
    (eager_losses, eager_model), (losses, model) = runs
    torch.testing.assert_close(losses, eager_losses, **BF16)
    for a, b in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, **BF16)
    engine.reset()
    model = copy.deepcopy(base)
    r = engine.explain(step)(model, torch.optim.AdamW(model.parameters(), lr=1e-3), inputs)
    assert (r.graph_count, r.graph_break_count) == (2, 1)   # forward+loss, the AdamW step; backward between
