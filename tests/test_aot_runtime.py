"""The AOT stage runs a captured graph with eager's results: outputs, gradients, input
mutations, views, BatchNorm statistics, optimizer steps, for both aot backends."""

import copy

import pytest
import torch
import torch.fx

from engine.aot import aot_compile
from engine.backends.aot_eager import aot_eager, aot_eager_decomp_partition, run_graph

BACKENDS = [aot_eager, aot_eager_decomp_partition]


def close(a, b, **kw):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, **kw)


def clone_args(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]


def run_both(backend, module, args, backward=True):
    """Eager on one copy of module and inputs, compiled on another; compare everything."""
    eager_mod, comp_mod = module, copy.deepcopy(module)
    gm = torch.fx.symbolic_trace(comp_mod)
    eager_args, comp_args = clone_args(args), clone_args(args)
    compiled = backend(gm, clone_args(args))
    expected, got = eager_mod(*eager_args), compiled(*comp_args)
    close(got, expected)
    for a, b in zip(comp_args, eager_args):
        close(a, b)
    if backward:
        outs_e = expected if isinstance(expected, (tuple, list)) else [expected]
        outs_c = got if isinstance(got, (tuple, list)) else [got]
        torch.manual_seed(1)
        cot = [torch.randn_like(o) if o.is_floating_point() else None for o in outs_e]
        torch.autograd.backward([o for o in outs_e if o.requires_grad], [c for o, c in zip(outs_e, cot) if o.requires_grad])
        torch.autograd.backward([o for o in outs_c if o.requires_grad], [c for o, c in zip(outs_c, cot) if o.requires_grad])
        for a, b in zip(comp_args, eager_args):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                close(a.grad, b.grad)
        for (name, p), (_, q) in zip(comp_mod.named_parameters(), eager_mod.named_parameters()):
            close(p.grad, q.grad, msg=f"grad of {name}")
    for (name, p), (_, q) in zip(comp_mod.named_buffers(), eager_mod.named_buffers()):
        close(p, q, msg=f"buffer {name}")
    return compiled, got


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))).tanh()


@pytest.mark.parametrize("backend", BACKENDS)
def test_inference_graph_gives_eager_outputs(backend):
    with torch.no_grad():
        run_both(backend, MLP(), [torch.randn(4, 8)], backward=False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_outputs_and_gradients_match_eager(backend):
    run_both(backend, MLP(), [torch.randn(4, 8, requires_grad=True)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_optimizer_steps_track_eager(backend):
    torch.manual_seed(0)
    eager = MLP()
    comp = copy.deepcopy(eager)
    compiled = backend(torch.fx.symbolic_trace(comp), [torch.randn(4, 8)])
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (eager, comp)]
    for step in range(3):
        x, y = torch.randn(4, 8), torch.randn(4, 4)
        for model, opt, fn in ((eager, opts[0], eager), (comp, opts[1], compiled)):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(fn(x), y)
            loss.backward()
            opt.step()
    for p, q in zip(comp.parameters(), eager.parameters()):
        close(p, q)


class MutatesInput(torch.nn.Module):
    def forward(self, x, y):
        y.add_(1)               # an input mutated in place: written back after the call
        return x * y, y.sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_mutation_is_applied_to_the_real_input(backend):
    run_both(backend, MutatesInput(), [torch.randn(3, requires_grad=True), torch.randn(3)])


class BN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_batchnorm_train_updates_running_stats(backend):
    module = BN().train()
    run_both(backend, module, [torch.randn(2, 3, 6, 6, requires_grad=True)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_batchnorm_eval_inference(backend):
    module = BN().eval()
    module.bn.running_mean.uniform_()
    with torch.no_grad():
        run_both(backend, module, [torch.randn(2, 3, 6, 6)], backward=False)


class Views(torch.nn.Module):
    def forward(self, x):
        return x.view(-1), x.t(), x[1], (x * 2).view(-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_that_alias_inputs_are_real_views(backend):
    x = torch.randn(3, 4, requires_grad=True)
    compiled, (flat, t, row, doubled) = run_both(backend, Views(), [x])
    base = torch.randn(3, 4)
    outs = compiled(base)
    assert outs[0]._base is base and outs[1]._base is base and outs[2]._base is base
    base.add_(1)      # eager's views see later writes to the input
    close(outs[1], base.t())
    close(outs[2], base[1])


class DetachedThenWritten(torch.nn.Module):
    def forward(self, x, w):
        y = x @ w.t()
        return torch.relu_(y.detach()), y      # the first output shares the second's memory


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_output_that_requires_grad_is_not_rebuilt_from_one_that_does_not(backend):
    # fuzz seed 300706: y came back as a view of y.detach(), without requires_grad
    x, w = torch.randn(4, 6), torch.randn(6, 6, requires_grad=True)
    _, (relu, y) = run_both(backend, DetachedThenWritten(), [x, w])
    assert y.requires_grad and not relu.requires_grad


class Mixed(torch.nn.Module):
    def forward(self, a, b, n):
        return (a * b).sum(dim=n), a.detach() + 1, (b > 0).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_requires_grad_and_non_differentiable_outputs(backend):
    a, b = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    compiled, outs = run_both(backend, Mixed(), [a, b, 1])
    assert outs[0].requires_grad and not outs[1].requires_grad and outs[2].dtype == torch.int64


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_grad_call_of_a_graph_compiled_with_grad(backend):
    model = MLP()
    compiled = backend(torch.fx.symbolic_trace(model), [torch.randn(4, 8, requires_grad=True)])
    x = torch.randn(4, 8, requires_grad=True)
    with torch.no_grad():
        out = compiled(x)
        expected = model(x)
    assert not out.requires_grad
    close(out, expected)
    assert len(compiled.cache) == 2          # a training entry and an inference entry


@pytest.mark.parametrize("backend", BACKENDS)
def test_new_shapes_recompile_and_stay_correct(backend):
    model = MLP()
    compiled = backend(torch.fx.symbolic_trace(model), [torch.randn(4, 8)])
    for batch in (4, 7, 1):
        x = torch.randn(batch, 8, requires_grad=True)
        out = compiled(x)
        close(out, model(x))
        out.sum().backward()
    assert len(compiled.cache) >= 3


def test_double_backward_is_refused_with_a_clear_error():
    def f(x):
        return (x.sin() ** 2).sum()

    compiled = aot_eager(torch.fx.symbolic_trace(f), [torch.randn(3, requires_grad=True)])
    x = torch.randn(3, requires_grad=True)
    (g,) = torch.autograd.grad(compiled(x), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.sum().backward()


def test_compilers_receive_functional_aten_graphs_with_flat_io():
    seen = {}

    def recording(name):
        def compiler(gm, example_inputs):
            seen[name] = (gm, example_inputs)
            return gm
        return compiler

    compiled = aot_compile(torch.fx.symbolic_trace(MutatesInput()), [torch.randn(3, requires_grad=True), torch.randn(3)],
                           fw_compiler=recording("fw"), bw_compiler=recording("bw"))
    for name in ("fw", "bw"):
        gm, examples = seen[name]
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        assert len(placeholders) == len(examples)
        for node in gm.graph.nodes:
            if node.op == "call_function" and hasattr(node.target, "_schema"):
                assert not node.target._schema.is_mutable, f"{name} graph mutates: {node.format_node()}"
                assert node.target.namespace in ("aten", "prims")
    out = seen["fw"][0](*seen["fw"][1])
    assert isinstance(out, tuple)
    x, y = torch.randn(3, requires_grad=True), torch.zeros(3)
    compiled(x, y)
    close(y, torch.ones(3))


def test_get_attr_parameters_are_lifted_and_read_live():
    model = MLP()
    gm = torch.fx.symbolic_trace(model)
    compiled = aot_compile(gm, [torch.randn(2, 8)], fw_compiler=run_graph)
    x = torch.randn(2, 8)
    with torch.no_grad():
        model.fc2.bias.add_(10.0)       # an update after compile is seen: parameters are inputs
        close(compiled(x), model(x))


def sgd_update_graph():
    """What capture records for `loss = (x * w).sum(); with torch.no_grad(): w.sub_(0.1 * g)`:
    grad mode switches are graph nodes."""
    g = torch.fx.Graph()
    x, w, grad = g.placeholder("x"), g.placeholder("w"), g.placeholder("g")
    loss = g.call_method("sum", (g.call_function(torch.mul, (x, w)),))
    g.call_function(torch._C._set_grad_enabled, (False,))
    g.call_method("sub_", (w, g.call_function(torch.mul, (grad, 0.1))))
    g.call_function(torch._C._set_grad_enabled, (True,))
    g.output(loss)
    return torch.fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("backend", BACKENDS)
def test_parameter_update_under_no_grad_inside_a_training_graph(backend):
    x, g, w = torch.randn(3), torch.randn(3), torch.randn(3, requires_grad=True)
    gm = sgd_update_graph()
    compiled = backend(gm, [x, w.detach().clone().requires_grad_(), g])
    w_eager = w.detach().clone().requires_grad_()
    w_comp = w.detach().clone().requires_grad_()
    gm(x, w_eager, g).backward()
    compiled(x, w_comp, g).backward()
    close(w_comp, w_eager)
    close(w_comp.grad, w_eager.grad)
    assert w_comp.is_leaf and w_comp.requires_grad


class ViewsOfAnOutput(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        return y, y.view(-1), y[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_that_are_views_of_another_output_stay_views(backend):
    x = torch.randn(2, 3, requires_grad=True)
    compiled, _ = run_both(backend, ViewsOfAnOutput(), [x])
    y, flat, row = compiled(torch.randn(2, 3, requires_grad=True))
    assert flat._base is y and row._base is y
    flat.add_(1)                     # as in eager: writes through to y (no custom-Function view error)
    torch.testing.assert_close(y.view(-1), flat)


def test_views_of_outputs_are_rebuilt_from_a_compiler_that_returns_fresh_buffers():
    def fresh(gm, example_inputs):
        return lambda *args: tuple(o.clone() for o in gm(*args))

    compiled = aot_compile(torch.fx.symbolic_trace(ViewsOfAnOutput()), [torch.randn(2, 3)], fw_compiler=fresh)
    x = torch.randn(2, 3)
    y, flat, row = compiled(x)
    close(y, x * 2)
    close(flat, (x * 2).view(-1))
    close(row, (x * 2)[0])
    assert flat._base is y


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_inputs_the_guards_pin_are_not_rekeyed_but_aliasing_still_is(backend):
    """Through engine.compile the capture's guards pin every input's dtype, shape, strides
    and requires_grad, so the AOT stage keys later calls on what the guards do not see: an
    input's storage offset and which inputs share memory, where the graph writes an input.
    The same shapes at other offsets, and two arguments that are views of one buffer, still
    give eager's results."""
    import engine

    def pure(x, y):
        return x * 2 + y

    def writes(x, y):
        x.add_(1)
        return x + y

    engine.reset()
    for fn in (pure, writes):
        compiled = engine.compile(fn, backend=backend)
        for make in (lambda: (torch.randn(8), torch.randn(8)),
                     lambda: (torch.randn(9)[1:], torch.randn(8)),            # another storage offset
                     lambda: (lambda b: (b[:8], b.view(2, 8)[0]))(torch.randn(16))):   # y is x's memory
            args = make()
            want_args = [a.clone() for a in args]
            if args[1].data_ptr() == args[0].data_ptr():
                base = want_args[0]
                want_args = [base, base]
            want = fn(*want_args)
            got = compiled(*args)
            close(got, want)
            close(args[0], want_args[0])


def test_the_generated_code_does_not_recheck_the_layout_of_inputs_the_guards_pin():
    """A model's parameters and a static input are pinned by the capture's guards, so the
    generated wrapper reads them as they are; a new layout (a transposed input) fails the
    guards and recompiles, with eager's result."""
    import engine
    from engine_helpers import logs

    lin = torch.nn.Linear(6, 6)

    def fn(x):
        with torch.no_grad():
            return torch.relu(lin(x)) * 2

    engine.reset()
    compiled = engine.compile(fn, backend="inductor")
    x = torch.randn(6, 6)
    with logs("output_code") as code:
        close(compiled(x), fn(x))
    text = "\n".join(code)
    assert "def call(" in text and "expect_input(" not in text.split("def call(")[1], text[-2000:]
    x = torch.randn(6, 6).t()
    close(compiled(x), fn(x))


class LossAndLogits(torch.nn.Module):
    """Returns what HF models return: the loss and the logits it was computed from."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x, labels):
        logits = self.fc(x)
        return torch.nn.functional.cross_entropy(logits, labels), logits, logits.abs().sqrt()


def test_a_backward_without_some_outputs_gradients_is_compiled_only_where_zeros_could_turn_nan():
    """loss.backward() alone leaves the logits and sqrt(|logits|) without a gradient. The
    logits' zeros are only added to the loss's gradient, exactly, so the compiled backward
    serves; the sqrt's backward divides by 2*sqrt(0) where a logit is 0, so each pattern of
    missing gradients that includes it gets a backward compiled without it, once."""
    compiled_bw = []

    def record(gm, example_inputs):
        if gm.meta.get("aot_graph", ("",))[0] == "backward":
            compiled_bw.append(gm)
        return gm

    model, x, labels = LossAndLogits(), torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    with torch.no_grad():
        model.fc.weight[0].zero_()
        model.fc.bias[0] = 0              # logits[:, 0] are 0: sqrt's gradient there is inf
    compiled = aot_compile(torch.fx.symbolic_trace(model), [x, labels], fw_compiler=record)
    assert len(compiled_bw) == 1
    for _ in range(2):
        model.zero_grad()
        loss, logits, root = compiled(x, labels)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x, labels)[0].backward()
        for got, expected in zip(grads, model.parameters()):
            close(got, expected.grad)
        assert all(g.isfinite().all() for g in grads)
    assert len(compiled_bw) == 2          # the full backward, then one without sqrt's part
    for _ in range(2):
        loss, logits, root = compiled(x, labels)
        (loss + logits.sum()).backward()   # another pattern: the sqrt's gradient alone is missing
    assert len(compiled_bw) == 3
    loss, logits, root = compiled(x, labels)
    (loss + root.sum()).backward()         # no gradient for the logits alone: only added, exact
    assert len(compiled_bw) == 3


def test_the_inputs_placement_is_the_same_from_cpp_as_from_python(monkeypatch):
    # a graph that writes its inputs is keyed on where they lie on every call (storage
    # offsets, which inputs share memory); the C++ path of the common case (each input on a
    # storage of its own: an optimizer step's hundreds) gives what the Python path gives, and
    # leaves every other case to it
    from engine.aot import inputs
    from engine.guards import native
    assert native.wait(600), native.build_error()
    base, p = torch.randn(20), torch.nn.Parameter(torch.randn(4, 3))
    cases = [
        [torch.randn(3) for _ in range(600)] + [p],      # every input on its own storage
        [base[2:], torch.randn(3), p.t()],               # storage offsets, a view of a parameter
        [base[2:], base[:3], torch.randn(2)],            # two views of one storage
        [torch.randn(3), 1.5, None],                     # not all tensors
        [torch.empty(0), torch.empty(0)],                # empty storages (address 0)
        [p, p],                                          # one tensor twice
    ]
    from_cpp = [inputs.placement_key(c) for c in cases]
    assert [native.placement(c) is not None for c in cases] == [True, True, False, False, False, False]
    monkeypatch.setattr(inputs, "native_placement", lambda args: None)
    assert from_cpp == [inputs.placement_key(c) for c in cases]
    assert from_cpp[2][1] == (0, 0, 2) and from_cpp[1][0] == (2, 0, 0)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_a_batch_norm_run_eagerly_then_compiled_leaves_its_running_stats_version(backend):
    # eager's batch norm updates its running statistics without a new version, and saves
    # them for its backward. Here the first call of the module runs eagerly (the graph also
    # resizes an input in place), the second is compiled: its write-back of the statistics
    # must not give them a new version either, or the first one's backward refuses them
    # (fuzz 941102, "modified by an inplace operation")
    import engine

    def fn(net, x, y):
        t0 = net(y)
        x.squeeze_()
        engine.graph_break()
        return net(t0) * 2

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    ref = copy.deepcopy(net)
    y = torch.randn(6, 4)
    got = engine.compile(fn, backend=backend)(net, torch.randn(6, 4), y)
    want = fn(ref, torch.randn(6, 4), y)
    got.sum().backward()
    want.sum().backward()
    close(got, want)
    for (name, a), b in zip(net.state_dict().items(), ref.state_dict().values()):
        close(a, b, msg=name)
        assert a._version == b._version or not name.startswith("1.running"), name
    for a, b in zip(net.parameters(), ref.parameters()):
        close(a.grad, b.grad)
