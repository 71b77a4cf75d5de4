"""Tensor guards checked in one C++ call (engine/guards/native.py): the same answers as the
generated Python tests, for every property a tensor guard reads, and a graph is reused
exactly when it would be with the Python guards."""

import pytest
import torch

import engine
from engine import config
from engine.guards import native
from engine_helpers import cache_entries as entries, fresh_engine  # noqa: F401 (fresh_engine: autouse)


@pytest.fixture(autouse=True)
def native_built():
    if not native.wait(timeout=600):
        pytest.skip(f"the C++ tensor checker did not build here: {native._state['failed']}")


def scale(x, w):
    return x * w.sum()


def compiles(f, *args):
    """How many graphs a call of f compiles, and its result."""
    before = len(entries(scale))
    out = f(*args)
    return len(entries(scale)) - before, out


def test_every_tensor_property_a_guard_reads_is_checked_in_cpp():
    f = engine.compile(scale, backend="eager", dynamic=False)
    x, w = torch.randn(4, 3), torch.nn.Parameter(torch.randn(3))
    assert compiles(f, x, w)[0] == 1
    assert all("___tensors((" in e.guards.code for e in entries(scale)), entries(scale)[0].guards.code
    assert compiles(f, torch.randn(4, 3), w)[0] == 0                  # new values: the same graph
    changed = {
        "dtype": (x.double(), w),
        "size": (torch.randn(5, 3), w),
        "stride": (torch.randn(3, 4).t(), w),
        "requires_grad": (x.clone().requires_grad_(), w),
        "type": (x, w.detach().clone()),                              # a Tensor where a Parameter was
    }
    for what, args in changed.items():
        n, out = compiles(f, *args)
        assert n == 1, what                                          # each one recompiles
        torch.testing.assert_close(out, scale(*args))
        assert compiles(f, *args)[0] == 0, what                       # and is then served


def test_a_symbolic_size_is_left_to_the_shape_guards():
    f = engine.compile(scale, backend="eager", dynamic=True)
    w = torch.randn(3)
    assert compiles(f, torch.randn(4, 3), w)[0] == 1
    for n in (5, 9, 2):
        got, out = compiles(f, torch.randn(n, 3), w)
        assert got == 0 and out.shape == (n, 3)
    assert compiles(f, torch.randn(4, 3).double(), w.double())[0] == 1   # still checked: the dtype


def test_switched_off_the_guards_stay_python():
    with config.patch(native_guards=False):
        f = engine.compile(scale, backend="eager")
        f(torch.randn(2, 3), torch.randn(3))
    code = entries(scale)[0].guards.code
    assert "___tensors" not in code and ".stride() ==" in code
