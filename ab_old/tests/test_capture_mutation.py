"""A call that writes to a tensor is never dropped, however it is spelled: whether it
mutates comes from the aten ops it runs (their `Tensor(a!)` arguments), not from a list
of names."""

import inspect

import pytest
import torch
import torch.nn.functional as F

import engine


def _inplace_functionals():
    out = []
    for name in sorted(dir(F)):
        fn = getattr(F, name)
        if name.startswith("_") or not callable(fn):
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        if "inplace" in params:
            out.append(name)
    return out


INPLACE = _inplace_functionals()


def test_the_sweep_finds_the_functionals():
    assert {"relu", "leaky_relu", "hardtanh", "elu", "dropout", "threshold"} <= set(INPLACE)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", INPLACE)
def test_an_unused_inplace_functional_still_writes(name, backend):
    fn = getattr(F, name)
    kwargs = {"threshold": 0.1, "value": 0.0} if name == "threshold" else {}
    if name.startswith(("dropout", "alpha_dropout", "feature_alpha_dropout")):
        kwargs["training"] = False        # deterministic: p is applied only in training
        kwargs["p"] = 0.5

    def f(x):
        y = x * 2
        fn(y, inplace=True, **kwargs)    # result unused: only the write matters
        return y

    x = torch.randn(2, 3, 4) if name == "dropout1d" else torch.randn(2, 3, 4, 4)
    engine.reset()
    torch.testing.assert_close(engine.compile(f, backend=backend)(x), f(x))


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_modules_methods_and_out_forms(backend):
    def f(x, buf):
        y = x * 2
        torch.nn.ReLU(inplace=True)(y)
        y.clamp_(max=1.0)
        torch.add(y, 1, out=buf)
        y[0] = 5.0
        torch.sigmoid_(y)
        return y

    x = torch.randn(4, 3)
    b1, b2 = torch.empty(4, 3), torch.empty(4, 3)
    engine.reset()
    got = engine.compile(f, backend=backend)(x, b1)
    torch.testing.assert_close(got, f(x, b2))
    torch.testing.assert_close(b1, b2)
