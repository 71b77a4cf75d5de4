"""The capture engine on user programs: results equal eager PyTorch's, graphs are counted
like PyTorch's, and what the capture cannot model still runs correctly."""

import collections
import dataclasses

import pytest
import torch

import engine
from engine_helpers import fresh_engine  # noqa: F401 (fresh_engine: autouse)


def graphs_of(fn, *args, **kwargs):
    """Run fn compiled with a recording backend; return (result, graphs)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return engine.compile(fn, backend=backend)(*args, **kwargs), graphs


def test_a_straight_line_program_is_one_graph():
    def fn(x, y):
        a = x * 2.5 + y / 3
        return a.sin(), a.shape, -a

    x, y = torch.randn(4, 5), torch.randn(4, 5)
    out, graphs = graphs_of(fn, x, y)
    expected = fn(x, y)
    assert len(graphs) == 1
    torch.testing.assert_close(out[0], expected[0])
    assert out[1] == torch.Size([4, 5])


def test_python_features_inline_into_one_graph():
    Point = collections.namedtuple("Point", ["x", "y"])

    @dataclasses.dataclass
    class Pair:
        a: torch.Tensor
        b: torch.Tensor

    def helper(t, *rest, scale=1.0, **extra):
        total = t
        for r in rest:
            total = total + r
        return total * scale + extra.get("bias", 0)

    def fn(x, p):
        fns = [lambda t: t + 1, lambda t: t * 2]
        outs = [f(x) for f in fns]
        d = {f"k{i}": o.sum() for i, o in enumerate(outs)}
        q = Point(p.x * 2, y=p.y + 1)._replace(x=p.y)
        pair = Pair(helper(x, *outs, scale=0.5, bias=1.0), q.x)
        return sorted(d), pair, q, sum(o.mean() for o in outs)

    x = torch.randn(3)
    p = Point(torch.randn(3), torch.randn(3))
    out, graphs = graphs_of(fn, x, p)
    expected = fn(x, p)
    assert len(graphs) == 1
    assert out[0] == expected[0]
    assert type(out[1]) is Pair and type(out[2]) is Point
    torch.testing.assert_close(out[1].a, expected[1].a)
    torch.testing.assert_close(out[3], expected[3])


def test_modules_are_inlined_with_parameters_as_inputs():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = engine.compile(model, backend=backend)
    assert isinstance(compiled, engine.OptimizedModule) and compiled._orig_mod is model
    model.note = "hi"
    assert compiled.note == "hi"  # attribute access forwards to the original
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), model(x))
    assert len(graphs) == 1
    sources = [n.meta["source"] for n in graphs[0].graph.nodes if n.op == "placeholder"]
    assert sources == ["L['input']", "getattr(L['self'], '0').weight", "getattr(L['self'], '0').bias",
                       "getattr(L['self'], '2').weight", "getattr(L['self'], '2').bias"]


def test_side_effects_are_replayed_after_the_graph():
    log = []

    class Holder:
        def __init__(self):
            self.calls = 0

    def fn(x, h, items):
        h.calls += 1
        items.append(x * 2)
        log.append(("seen", x.shape[0]))
        return x + len(items)

    h, items = Holder(), [torch.zeros(1)]
    out = engine.compile(fn, backend="eager")(torch.ones(3), h, items)
    assert h.calls == 1 and len(items) == 2 and log == [("seen", 3)]
    torch.testing.assert_close(out, torch.full((3,), 3.0))
    torch.testing.assert_close(items[1], torch.full((3,), 2.0))


def test_try_except_in_inlined_code_does_not_break():
    def checked(a, b):
        if b == 0:
            raise ZeroDivisionError("b is zero")
        return a / b

    def fn(x):
        try:
            y = checked(x, 0)
        except ZeroDivisionError:
            y = x * 0.5
        return y + 1

    x = torch.randn(4)
    out, graphs = graphs_of(fn, x)
    assert len(graphs) == 1
    torch.testing.assert_close(out, x * 0.5 + 1)


def test_a_real_user_error_is_raised_with_the_same_type():
    def fn(x, k):
        if k < 0:
            raise ValueError("k must be non-negative")
        return x * k

    compiled = engine.compile(fn, backend="eager")
    with pytest.raises(ValueError):
        compiled(torch.randn(3), -1)
    with pytest.raises(RuntimeError):  # a shape error found by fake propagation: the real op raises it
        engine.compile(lambda a, b: a @ b, backend="eager")(torch.randn(2, 3), torch.randn(2, 3))


def test_grad_mode_blocks_and_gradients():
    def fn(x, w):
        with torch.no_grad():
            frozen = x @ w
        live = (x @ w).sum()
        return frozen, live, torch.is_grad_enabled()

    x = torch.randn(2, 3, requires_grad=True)
    w = torch.randn(3, 3, requires_grad=True)
    frozen, live, enabled = engine.compile(fn, backend="eager")(x, w)
    assert not frozen.requires_grad and live.requires_grad and enabled is True
    live.backward()
    torch.testing.assert_close(w.grad, x.detach().sum(0, keepdim=True).t().expand(3, 3))


def test_user_backend_receives_the_graph_and_real_example_inputs():
    seen = {}

    def backend(gm, example_inputs):
        seen["ops"] = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        seen["inputs"] = example_inputs
        return gm.forward

    x = torch.randn(2, 2)
    engine.compile(lambda t: torch.relu(t) + 1, backend=backend)(x)
    assert torch.relu in seen["ops"]
    assert seen["inputs"][0] is x


def test_unknown_backend_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        engine.compile(lambda t: t, backend="nope")
