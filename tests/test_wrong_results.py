"""No wrong results: programs the fuzzer and the OpInfo sweep found giving results that
differ from eager (or crashing), each compared with eager on every backend. Where a
program cannot be compiled correctly the engine breaks the graph (or runs aten ops) with a
reason, and the result is still eager's."""

import copy

import pytest
import torch

import engine
from tests.engine_helpers import fresh_engine  # noqa: F401  (autouse)

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
