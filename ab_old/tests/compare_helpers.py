"""Compiled against eager for the training and higher-order-op tests: outputs, dtypes and
gradients compared over a compiling call and a cached one; graph counts of torch.compile
on the same code, for comparison."""

import torch

import engine


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return []


def run_both(fn, make_inputs, params=(), backend="eager", tol=None):
    """fn compiled and eager on the same inputs: outputs, dtypes, and the gradients of the
    inputs and `params` compared. Returns the engine's explain() of fn."""
    torch.manual_seed(0)
    inputs = make_inputs()
    torch.manual_seed(0)
    expected = fn(*inputs)
    exp_grads = _grads(expected, inputs, params)
    engine.reset()
    compiled = engine.compile(fn, backend=backend)
    for _ in range(2):  # the first call compiles, the second runs the cached code
        inputs2 = [t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t
                   for t in inputs]
        torch.manual_seed(0)
        got = compiled(*inputs2)
        got_grads = _grads(got, inputs2, params)
        kw = tol or {}
        assert len(_tensors(got)) == len(_tensors(expected))
        assert len(got_grads) == len(exp_grads)
        for g, e in zip(_tensors(got), _tensors(expected)):
            assert g.dtype == e.dtype
            torch.testing.assert_close(g, e, **kw)
        for g, e in zip(got_grads, exp_grads):
            torch.testing.assert_close(g, e, **kw)
    assert not torch.is_autocast_enabled("cpu"), "the compiled code left autocast on"
    engine.reset()
    return engine.explain(fn)(*make_inputs())


def _grads(out, inputs, params):
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad] + list(params)
    outs = [t for t in _tensors(out) if t.requires_grad]
    if not leaves or not outs:
        return []
    loss = sum(t.float().sum() for t in outs)
    return [g if g is not None else torch.zeros(()) for g in torch.autograd.grad(loss, leaves, allow_unused=True)]


def torch_graphs(fn, *args):
    """The graphs torch.compile makes of fn (their op counts), for comparison."""
    import torch._dynamo
    torch._dynamo.reset()
    graphs = []

    def count(gm, example_inputs):
        graphs.append(sum(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes))
        return gm.forward

    torch.compile(fn, backend=count)(*args)
    torch._dynamo.reset()
    return graphs
