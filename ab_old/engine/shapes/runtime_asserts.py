"""What the capture assumed about data-dependent sizes, checked when the graph runs.

`t = w[w > 0]` has a size nobody knows before the graph runs (an unbacked symbol, u0).
Adding t to a 3-vector makes the trace assume u0 == 3 (a 1 would broadcast, and the shape
environment takes the case that needs no branch), and every later op, the backward too,
is traced with that size. At run time u0 may be 1: without a check, the graph computes
with the wrong size (a crash in the backward at best, a wrong shape at worst). torch.fx's
pass inserts an `aten._assert_scalar` for each such assumption right where its symbols are
known, so a run that breaks one raises, naming it, as under torch.compile."""

from __future__ import annotations

import torch
from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts


def insert_runtime_asserts(gm: torch.fx.GraphModule, shape_env, name: str) -> None:
    if shape_env is None or not any(shape_env.deferred_runtime_asserts.values()):
        return
    insert_deferred_runtime_asserts(gm, shape_env, name)
    gm.recompile()
