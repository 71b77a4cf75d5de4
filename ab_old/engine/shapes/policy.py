"""Which dimensions of an input tensor are symbolic.

- `dynamic=False`: never.
- `dynamic=True`: every dimension of every frame input, up front (sizes 0 and 1 still
  specialize: the ShapeEnv turns them into constants).
- `dynamic=None` (the default, "automatic dynamic"): static at first; each frame keeps the
  sizes it was compiled with per input source, and when a later compile of the same frame
  sees a different size at a dimension, that dimension is symbolic from then on.
- `engine.mark_dynamic(t, d)` / `engine.mark_static(t, d)` override both, per tensor.
- Parameters and buffers of modules stay static (as PyTorch's default does).
"""

from __future__ import annotations

import threading
from typing import Optional

from torch.fx.experimental.symbolic_shapes import DimDynamic

from .. import config

_local = threading.local()

# code object -> {source name: tuple of sizes, None where the size was seen to change}
_frame_sizes: dict = {}


def reset() -> None:
    _frame_sizes.clear()


def set_frame_options(code, dynamic: Optional[bool]) -> None:
    """Called as a frame's conversion starts: the OutputGraphs built for it read this."""
    _local.current = (code, dynamic)


def current_frame_options():
    return getattr(_local, "current", (None, None))


def automatic_dynamic_dims(code, source: str, sizes: tuple) -> set:
    """Record `sizes` for `source` in `code`'s frame state and return the dims that have
    changed since an earlier compile (those are symbolic from now on)."""
    state = _frame_sizes.setdefault(code, {})
    old = state.get(source)
    if old is None or len(old) != len(sizes):
        state[source] = tuple(sizes)
        return set()
    merged = tuple(None if (a is None or a != b) else a for a, b in zip(old, sizes))
    state[source] = merged
    return {d for d, v in enumerate(merged) if v is None}


def dim_policy(tensor, source: str, code, dynamic: Optional[bool], is_module_state: bool) -> list:
    """A DimDynamic per dimension of `tensor` read from `source`."""
    n = tensor.dim()
    static = [DimDynamic.STATIC] * n
    marked_static = set(getattr(tensor, "_dynamo_static_indices", ()) or ())
    marked_dynamic = set(getattr(tensor, "_dynamo_dynamic_indices", ()) or ()) - marked_static
    if dynamic is None and not config.assume_static_by_default:
        dynamic = True  # engine.config.assume_static_by_default = False: dynamic=True for every compile
    if dynamic is False or n == 0:
        return static
    if marked_dynamic:
        dims = [DimDynamic.DYNAMIC if d in marked_dynamic else DimDynamic.STATIC for d in range(n)]
    else:
        dims = list(static)
    if is_module_state:
        return dims
    if dynamic is True:
        auto = set(range(n))
    elif config.automatic_dynamic_shapes and code is not None:
        auto = automatic_dynamic_dims(code, source, tuple(tensor.size()))
    else:
        auto = set()
    for d in auto - marked_static - marked_dynamic:
        dims[d] = DimDynamic.DUCK
    return dims


def int_is_dynamic(code, source: str, value: int, dynamic: Optional[bool]) -> bool:
    """Is this int argument of the frame (`L['n']`) symbolic? dynamic=True: yes;
    dynamic=None: once a later compile sees another value (automatic dynamic, as PyTorch
    does for ints); dynamic=False: never. Floats always specialize."""
    if dynamic is None and not config.assume_static_by_default:
        dynamic = True
    if dynamic is False:
        return False
    if dynamic is True:
        return True
    if not config.automatic_dynamic_shapes or code is None:
        return False
    return bool(automatic_dynamic_dims(code, source, (value,)))
