"""Is a compiled graph's result wrong? Compared with eager against an fp64 run of the same
graph: a floating output is wrong when its RMS error against the fp64 result is above
`2 * (eager's RMS error) + engine.config.repro_tolerance`, or when it has NaN/inf where eager
has none; other outputs must equal eager's exactly, and shapes and dtypes must match."""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch
from torch.utils import _pytree as pytree

MULTIPLIER = 2.0


def compare(eager_gm: torch.fx.GraphModule, compiled_outputs: Any, make_inputs: Callable[[], list],
            tolerance: float) -> Optional[str]:
    """None when the compiled outputs are right, else what is wrong, with the numbers."""
    with torch.no_grad():
        eager = eager_gm(*make_inputs())
        reference, note = _fp64_outputs(eager_gm, make_inputs)
    ours = pytree.tree_leaves(compiled_outputs)
    theirs = pytree.tree_leaves(eager)
    refs = pytree.tree_leaves(reference) if reference is not None else theirs
    if len(ours) != len(theirs):
        return f"{len(ours)} outputs, eager has {len(theirs)}"
    for i, (c, e, r) in enumerate(zip(ours, theirs, refs)):
        wrong = _compare_one(c, e, r, tolerance, exact_reference=reference is None)
        if wrong:
            return f"output {i}: {wrong}{note}"
    return None


def _fp64_outputs(gm: torch.fx.GraphModule, make_inputs) -> tuple[Optional[Any], str]:
    """The graph run in float64 (its floating parameters and inputs cast); None when the
    graph cannot run that way (then eager itself is the reference)."""
    try:
        gm64 = copy.deepcopy(gm).to(torch.float64)
        inputs = [x.detach().to(torch.float64) if isinstance(x, torch.Tensor) and x.dtype.is_floating_point else x
                  for x in make_inputs()]
        return gm64(*inputs), ""
    except Exception as exc:
        return None, f" (no fp64 reference: {type(exc).__name__}; compared with eager)"


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not bool(finite.any()):
        return 0.0
    d = (a.double() - b.double())[finite]
    return float(torch.sqrt(torch.mean(d * d)))


def _compare_one(c: Any, e: Any, r: Any, tolerance: float, exact_reference: bool) -> Optional[str]:
    if not isinstance(e, torch.Tensor):
        if isinstance(c, torch.Tensor):
            c = c.item() if c.numel() == 1 else c
        return None if c == e else f"{c!r}, eager gives {e!r}"
    if not isinstance(c, torch.Tensor):
        return f"a {type(c).__name__}, eager gives a tensor"
    if tuple(c.shape) != tuple(e.shape):
        return f"shape {tuple(c.shape)}, eager gives {tuple(e.shape)}"
    if c.dtype != e.dtype:
        return f"dtype {c.dtype}, eager gives {e.dtype}"
    c, e = c.detach().cpu(), e.detach().cpu()
    if not (e.dtype.is_floating_point or e.dtype.is_complex):
        if torch.equal(c, e):
            return None
        return f"{int((c != e).sum())} of {e.numel()} values differ from eager's"
    bad = ~torch.isfinite(c) & torch.isfinite(e)
    if bool(bad.any()):
        return f"{int(bad.sum())} NaN/inf values where eager has finite ones"
    r = r.detach().cpu() if isinstance(r, torch.Tensor) else e
    ours = _rmse(c, r)
    eager = 0.0 if exact_reference else _rmse(e, r)
    limit = MULTIPLIER * eager + tolerance
    if ours > limit:
        return (f"RMS error against fp64 {ours:.6g}, eager's {eager:.6g}; the limit is "
                f"{MULTIPLIER:g} x {eager:.6g} + {tolerance:g} = {limit:.6g}")
    return None
