"""Shared helpers of the codegen tests: trace a function to an aten graph with make_fx
(the decompositions the inductor backend uses), compile it with engine.codegen and
compare with eager."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from engine.codegen import compile_fx_graph, decomposition_table


def compile_graph(fn, *inputs):
    gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    return compile_fx_graph(gm, list(inputs))


def check(fn, *inputs, rtol=1e-5, atol=1e-5, allow_fallback=False):
    """Compile fn's aten graph, run it, compare every output with eager; return the compiled graph."""
    compiled = compile_graph(fn, *inputs)
    if not allow_fallback:
        assert compiled.fallback_reason is None, compiled.fallback_reason
    got = pytree.tree_leaves(compiled(*inputs))
    want = pytree.tree_leaves(fn(*inputs))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype, (i, g.dtype, w.dtype)
            assert g.shape == w.shape, (i, g.shape, w.shape)
            if w.dtype.is_floating_point:
                torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"output {i}: {m}")
            else:
                assert torch.equal(g, w), (i, g, w)
        else:
            assert g == w, (i, g, w)
    return compiled


def stack_of_blocks():
    """(fn, inputs): four identical blocks (matmul, bias, layer norm, GELU) and one of another
    width, the repeated layers whose kernels the emitters compile once (kernel_copies)."""
    F = torch.nn.functional
    ws = [torch.randn(32, 32) / 6 for _ in range(4)] + [torch.randn(32, 48) / 6]

    def stack(x, *ws):
        for w in ws:
            x = F.gelu(F.layer_norm(x @ w + 1.0, (w.shape[1],)))
        return x
    return stack, (torch.randn(16, 32), *ws)


def peak_bytes(call) -> int:
    """The most CPU memory call() held at once beyond what it started with, from the
    profiler's allocation events (their running "Total Allocated")."""
    import json
    import os
    import tempfile

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"]
    events.sort(key=lambda e: e["ts"])
    assert events, "the profiler recorded no allocation"
    start = events[0]["args"]["Total Allocated"] - events[0]["args"]["Bytes"]
    return max(e["args"]["Total Allocated"] for e in events) - start
