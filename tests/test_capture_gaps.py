"""Capture gaps closed after the first version: captured scalar outputs (`.item()` in the
graph), graph breaks inside grad-mode `with` blocks, and graph counts that match PyTorch's.
Each test runs a user's program compiled and eagerly and compares; graph counts are
compared with torch._dynamo.explain where PyTorch gives the anchor."""

import pytest
import torch

import engine
from engine import config


@pytest.fixture(autouse=True)
def fresh():
    engine.reset()
    yield
    engine.reset()


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
