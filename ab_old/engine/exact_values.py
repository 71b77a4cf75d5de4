"""Values whose every bit matters: one compared for equality with its own max or min.

`amax`'s backward (and `x == x.max()` in user code) asks which elements equal the maximum.
A value recomputed in another loop (or another graph) than the one that found the maximum
can differ from it in the last bit: a vectorized libm `sin` and the scalar one do. Then no
element matches and the gradient is inf/NaN. Such a value is computed once and stored;
the partitioner and the lowering both ask this module which values those are."""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten

_EXTREMES = {aten.amax, aten.amin, aten.max, aten.min, aten.aminmax, aten.cummax, aten.cummin}
_EQUALITY = {aten.eq, aten.ne}


def _packets_reached(node: torch.fx.Node) -> set:
    """The op packets that read node, directly or through views of it."""
    seen, todo, found = set(), list(node.users), set()
    while todo:
        user = todo.pop()
        if user in seen or user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload):
            continue
        seen.add(user)
        if user.target.is_view:
            todo.extend(user.users)
        else:
            found.add(user.target.overloadpacket)
    return found


def compared_with_its_extreme(node: torch.fx.Node) -> bool:
    """node is reduced by a max/min and also compared for equality: keep one copy of it."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point or len(node.users) < 2:
        return False
    reached = _packets_reached(node)
    return bool(reached & _EXTREMES) and bool(reached & _EQUALITY)
