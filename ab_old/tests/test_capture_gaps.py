"""Capture gaps closed after the first version: captured scalar outputs (`.item()` in the
graph), graph breaks inside grad-mode `with` blocks, and graph counts that match PyTorch's.
Each test runs a user's program compiled and eagerly and compares; graph counts are
compared with torch._dynamo.explain where PyTorch gives the anchor."""

import pytest
import torch

import engine
from engine import config
from engine_helpers import fresh_engine  # noqa: F401 (fresh_engine: autouse)


@pytest.fixture
def scalars(monkeypatch):
    monkeypatch.setattr(config, "capture_scalar_outputs", True)


def _torch_counts(fn, *args, capture_scalar_outputs=False):
    import torch._dynamo as dynamo

    dynamo.reset()
    with dynamo.config.patch(capture_scalar_outputs=capture_scalar_outputs):
        out = dynamo.explain(fn)(*args)
    dynamo.reset()
    return out.graph_count, out.graph_break_count


def _ours(fn, *args):
    engine.reset()
    out = engine.explain(fn)(*args)
    engine.reset()
    return out


# ---------------------------------------------------------------------- 1. capture_scalar_outputs


def test_item_is_a_graph_value_that_flows_into_ops(scalars):
    def fn(x, y):
        s = x.sum().item()
        return y * s + 1, s

    x, y = torch.randn(3), torch.randn(3)
    out = _ours(fn, x, y)
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    assert (1, 0) == _torch_counts(fn, x, y, capture_scalar_outputs=True)
    f = engine.compile(fn, backend="eager")
    for _ in range(2):  # the second call hits the cache with new values: never the traced number
        x, y = torch.randn(3), torch.randn(3)
        got, want = f(x, y), fn(x, y)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] and type(got[1]) is float


def test_int_item_arithmetic_and_a_later_break(scalars, capsys):
    def fn(x, y):
        n = x.long().sum().item()
        z = y * (n * 2 + 1)
        print("between")
        return z * n, n

    x, y = torch.tensor([1.0, 2.0]), torch.randn(2)
    out = _ours(fn, x, y)
    assert (out.graph_count, out.graph_break_count) == (2, 1)
    assert (2, 1) == _torch_counts(fn, x, y, capture_scalar_outputs=True)
    for backend in ("eager", "aot_eager"):
        engine.reset()
        got, want = engine.compile(fn, backend=backend)(x, y), fn(x, y)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1] == 3


def test_control_flow_on_a_captured_scalar_breaks_with_a_clear_reason(scalars):
    def fn(x):
        s = x.sum().item()
        if s > 0:
            return x + 1
        return x - 1

    x = torch.randn(3)
    out = _ours(fn, x)
    assert (out.graph_count, out.graph_break_count) == (2, 1)
    assert (2, 1) == _torch_counts(fn, x, capture_scalar_outputs=True)
    [r] = out.break_reasons
    assert r.graph_break_id == "GB0019" and "zuf0 > 0" in r.reason
    f = engine.compile(fn, backend="eager")
    for v in (x.abs(), -x.abs(), x.abs()):  # both sides, same cache entry
        torch.testing.assert_close(f(v), fn(v))


def test_tolist_captures_one_scalar_per_element(scalars):
    def fn(x):
        a, b = x.tolist()
        return torch.full((2,), a) * b, a + b

    x = torch.tensor([2.0, 3.0])
    out = _ours(fn, x)
    assert (out.graph_count, out.graph_break_count) == (1, 0)
    f = engine.compile(fn, backend="eager")
    for v in (x, torch.tensor([-1.0, 4.0])):
        got, want = f(v), fn(v)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == want[1]


def test_without_the_knob_item_breaks_and_hints_at_it():
    def fn(x):
        return x * x.sum().item()

    x = torch.randn(3)
    out = _ours(fn, x)
    assert (out.graph_count, out.graph_break_count) == _torch_counts(fn, x) == (2, 1)
    [r] = out.break_reasons
    assert r.graph_break_id == "GB0004" and "capture_scalar_outputs" in r.hint
    torch.testing.assert_close(engine.compile(fn, backend="eager")(x), fn(x))


# ---------------------------------------------------------------------- 2. breaks inside grad-mode blocks


def _no_grad_block(x):
    y = x * 2
    with torch.no_grad():
        z = y + 1
        print("inside", torch.is_grad_enabled())
        w = z * 2
    return w + y, torch.is_grad_enabled()


def _nested_blocks(x):
    y = x * 2
    with torch.no_grad():
        with torch.enable_grad():
            z = y + 1
            print("inner", torch.is_grad_enabled())
        w = z * 2
        print("outer", torch.is_grad_enabled())
    return w + y, z


def _branch_in_block(x):
    with torch.set_grad_enabled(False):
        y = x * 2
        if y.sum() > 0:  # a data-dependent jump inside the block
            r = y + 1
        else:
            r = y - 1
    return r * x


@pytest.mark.parametrize("fn", [_no_grad_block, _nested_blocks, _branch_in_block])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_break_inside_a_grad_mode_block_splits_the_frame(fn, backend, capsys):
    x = torch.randn(3, requires_grad=True)
    want = fn(x)
    eager_out = capsys.readouterr().out
    got = engine.compile(fn, backend=backend)(x)
    assert capsys.readouterr().out == eager_out  # the break ran under the block's mode
    assert torch.is_grad_enabled()
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w)
            assert g.requires_grad == w.requires_grad
        else:
            assert g == w
    # gradients flow through the parts computed with grad enabled, exactly as eagerly
    xe, xc = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    for f, v in ((fn, xe), (engine.compile(fn, backend=backend), xc)):
        out = f(v)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)


@pytest.mark.parametrize("fn", [_no_grad_block, _nested_blocks, _branch_in_block])
def test_graph_counts_inside_grad_blocks_match_pytorch(fn, capsys):
    x = torch.randn(3, requires_grad=True)
    out = _ours(fn, x)
    assert (out.graph_count, out.graph_break_count) == _torch_counts(fn, x)
    assert out.graph_count > 1  # split, not run eagerly as a whole
    assert torch.is_grad_enabled()


@engine.disable
def _fails(y):
    raise ValueError("boom")


def test_an_exception_at_the_break_leaves_the_block_with_the_mode_restored():
    def fn(x):
        with torch.no_grad():
            y = x * 2
            _fails(y)
        return y

    with pytest.raises(ValueError, match="boom"):
        engine.compile(fn, backend="eager")(torch.randn(3))
    assert torch.is_grad_enabled()
    with torch.no_grad():  # and the other way round
        with pytest.raises(ValueError):
            engine.compile(fn, backend="eager")(torch.randn(3))
        assert not torch.is_grad_enabled()


def test_an_exception_after_the_break_runs_the_blocks_exit():
    def fn(x, n):
        with torch.no_grad():
            y = x * 2
            print("break")
            y = y + [1, 2][n]  # IndexError in the resume function, inside the block
        return y

    f = engine.compile(fn, backend="eager")
    torch.testing.assert_close(f(torch.ones(2), 1), torch.full((2,), 4.0))
    with pytest.raises(IndexError):
        f(torch.ones(2), 5)
    assert torch.is_grad_enabled()


def test_a_break_inside_a_try_block_still_runs_the_frame_eagerly():
    def fn(x):
        try:
            with torch.no_grad():
                y = x * 2
                print("break")
        finally:
            z = x + 1
        return y + z

    x = torch.randn(3, requires_grad=True)
    out = _ours(fn, x)
    assert out.graph_count == 0  # not split (a try block): eager, and correct
    got = engine.compile(fn, backend="eager")(x)
    torch.testing.assert_close(got, fn(x))
    assert got.requires_grad and torch.is_grad_enabled()


def test_a_closure_cell_live_at_a_break_is_passed_as_the_cell():
    seen = {}

    def fn(x):
        f = lambda v: seen.setdefault("v", v)  # noqa: E731  closes over the caller's cell `seen`
        print("break")
        return x * 2 + f(1)

    x = torch.randn(2)
    torch.testing.assert_close(engine.compile(fn, backend="eager")(x), x * 2 + 1)
    assert seen == {"v": 1}


@engine.disable
def _append_to(acc, v):
    acc.append(v)


def test_a_new_list_passed_to_a_break_is_the_same_list_afterwards():
    def fn(x):
        acc = []
        _append_to(acc, x + 1)  # runs eagerly, mutates the list the resume function goes on with
        return acc, x * 2

    x = torch.randn(2)
    acc, y = engine.compile(fn, backend="eager")(x)
    assert len(acc) == 1
    torch.testing.assert_close(acc[0], x + 1)
    torch.testing.assert_close(y, x * 2)


# ---------------------------------------------------------------------- 3. optimizer steps


def _training(make_opt):
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = make_opt(model.parameters())

    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return model, opt, step


def _state(opt):
    return [(k, v) for s in opt.state.values() for k, v in sorted(s.items())]


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd_nesterov_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=0.01, foreach=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_optimizer_steps_compile_and_keep_parameters_and_state_exact(name, backend):
    m1, o1, eager_step = _training(OPTIMIZERS[name])
    m2, o2, step = _training(OPTIMIZERS[name])
    compiled = engine.compile(step, backend=backend)
    for i in range(3):
        torch.manual_seed(100 + i)
        x, y = torch.randn(5, 4), torch.randn(5, 2)
        torch.testing.assert_close(compiled(x, y), eager_step(x, y))
        for p, q in zip(m1.parameters(), m2.parameters()):
            torch.testing.assert_close(q, p)
        s1, s2 = _state(o1), _state(o2)
        assert [k for k, _ in s1] == [k for k, _ in s2]
        for (_, a), (_, b) in zip(s1, s2):
            torch.testing.assert_close(b, a) if isinstance(a, torch.Tensor) else (b == a)
        assert torch.is_grad_enabled()


def test_sgd_step_is_its_own_graph_like_pytorch():
    x, y = torch.randn(5, 4), torch.randn(5, 2)
    _, _, step = _training(OPTIMIZERS["sgd"])
    out = _ours(step, x, y)
    _, _, step = _training(OPTIMIZERS["sgd"])
    assert (out.graph_count, out.graph_break_count) == (3, 2)
    assert _torch_counts(step, x, y) == (3, 2)
    # the update graph: one in-place add_ per parameter, under no_grad
    assert out.ops_per_graph[1] == ["<method add_>"] * 4, out.ops_per_graph


def test_an_optimizer_with_step_hooks_runs_its_step_eagerly():
    m1, o1, eager_step = _training(OPTIMIZERS["sgd"])
    m2, o2, step = _training(OPTIMIZERS["sgd"])
    calls = []
    for o in (o1, o2):
        o.register_step_post_hook(lambda opt, args, kwargs: calls.append(1))
    x, y = torch.randn(5, 4), torch.randn(5, 2)
    torch.testing.assert_close(engine.compile(step, backend="eager")(x, y), eager_step(x, y))
    for p, q in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(q, p)
    assert len(calls) == 2


# ---------------------------------------------------------------------- 3b. NumPy through torch._numpy

np = pytest.importorskip("numpy")


def _np_roundtrip(x):
    arr = x.numpy()
    arr2 = arr * 2 + 1
    return torch.from_numpy(arr2) - x, torch.as_tensor(arr.sum(axis=0)), arr.max()


def _np_in_out(a):
    b = np.sin(a) * 2
    c = b.T @ a
    return c, np.mean(b, axis=1), b.shape, b.dtype


def _same(got, want):
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    elif isinstance(want, (np.ndarray, np.generic)):
        assert got.dtype == want.dtype and np.shape(got) == np.shape(want)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    else:
        assert got == want


@pytest.mark.parametrize("fn,make", [(_np_roundtrip, lambda: (torch.randn(3, 4),)),
                                     (_np_in_out, lambda: (np.random.randn(4, 3).astype(np.float32),))])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_numpy_is_traced_into_one_graph(fn, make, backend):
    f = engine.compile(fn, backend=backend)
    for _ in range(2):
        args = make()
        _same(f(*args), fn(*args))
    args = make()
    out = _ours(fn, *args)
    assert (out.graph_count, out.graph_break_count) == _torch_counts(fn, *args) == (1, 0)


def test_ndarray_inputs_are_guarded_like_tensors():
    f = engine.compile(lambda a: np.cos(a) + a, backend="eager")
    for a in (np.ones((2, 2), np.float32), np.ones((2, 2), np.float64), np.arange(6.0).reshape(3, 2)):
        _same(f(a), np.cos(a) + a)


class _ScaledByNumpy(torch.nn.Module):
    """CTRL's embeddings (transformers): `inputs_embeds *= np.sqrt(self.d_model_size)`."""

    def __init__(self):
        super().__init__()
        self.d_model_size = 64
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.lin(x)
        x *= np.sqrt(self.d_model_size)
        return x * np.float32(0.5) + np.int64(3), np.sqrt(self.d_model_size)


def _print_then_scale(x, s):
    print("between the graphs")         # a break with a NumPy scalar on the stack
    return x * s


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_numpy_scalars_of_constants_are_constants_of_the_graph(backend, capsys):
    m = _ScaledByNumpy()
    x = torch.randn(2, 4)
    want = m(x)
    got = engine.compile(m, backend=backend)(x)
    _same(got, want)                                       # np.float64 stays np.float64 for Python
    assert _ours(m, x).graph_count == 1 and _ours(m, x).graph_break_count == 0
    fn = lambda t: _print_then_scale(t, np.sqrt(16.0)) + 1  # noqa: E731
    torch.testing.assert_close(engine.compile(fn, backend=backend)(torch.ones(2)), torch.full((2,), 5.0))


def test_numpy_the_capture_cannot_trace_still_runs_eagerly():
    def fn(x):
        arr = x.numpy()
        arr.fill(3.0)                 # mutates x through the shared memory: not a graph node
        total = float(arr.sum())      # Python needs the number
        return x * total, arr

    x1, x2 = torch.randn(3), torch.randn(3)
    x2.copy_(x1)
    _same(engine.compile(fn, backend="eager")(x2), fn(x1))
    torch.testing.assert_close(x2, x1)
    with pytest.raises(RuntimeError):  # .numpy() of a tensor that requires grad: the eager error
        engine.compile(lambda t: t.numpy(), backend="eager")(torch.ones(2, requires_grad=True))


def test_an_iterator_the_caller_holds_is_advanced_as_eagerly():
    def fn(it, x):
        for v in it:
            if v > 1:
                break
        return x + 1

    for f in (fn, engine.compile(fn, backend="eager")):
        it = iter([0, 1, 2, 3, 4])
        torch.testing.assert_close(f(it, torch.ones(2)), torch.full((2,), 2.0))
        assert next(it) == 3


def test_a_break_inside_a_loop_over_a_list_resumes_with_the_rest_of_the_loop(capsys):
    def fn(xs, y):
        for x in xs:
            y = y + x * 2
            print("step")
        return y

    xs = [torch.ones(2), torch.full((2,), 3.0), torch.full((2,), 5.0)]
    f = engine.compile(fn, backend="eager")
    for n in (3, 3, 1):
        torch.testing.assert_close(f(xs[:n], torch.zeros(2)), fn(xs[:n], torch.zeros(2)))
    out = _ours(fn, xs, torch.zeros(2))
    assert out.graph_count == 3  # one graph per iteration: the resume functions compile the loop
