"""`torch.autocast` regions in captured graphs.

An autocast `with` block becomes two graph nodes, `autocast_enter(...)` and
`autocast_exit(...)`, with constant arguments only: each does what `torch.autocast`'s
`__enter__` / `__exit__` do to the thread's autocast state. No object flows between them,
so a graph can end inside a block (a graph break) and the generated code, or the next
graph, can carry on from the same state. Under AOT tracing the two nodes run for real, so
the aten graphs carry the casts eager autocast makes, explicitly."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional

import torch


@dataclasses.dataclass(frozen=True)
class AutocastState:
    """One device's autocast setting, and the cache flag (global in torch)."""

    device: str
    enabled: bool
    dtype: torch.dtype
    cache_enabled: bool

    @staticmethod
    def current(device: str) -> "AutocastState":
        return AutocastState(device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device),
                             torch.is_autocast_cache_enabled())


def autocast_enter(device: str, enabled: bool, dtype: torch.dtype, cache_enabled: bool) -> None:
    """torch.autocast(device, dtype, enabled, cache_enabled).__enter__(), as a graph node."""
    torch.set_autocast_enabled(device, enabled)
    torch.set_autocast_dtype(device, dtype)
    torch.autocast_increment_nesting()
    torch.set_autocast_cache_enabled(cache_enabled)


def autocast_exit(device: str, prev_enabled: bool, prev_dtype: torch.dtype, prev_cache_enabled: bool) -> None:
    """The matching __exit__: back to the state from before the block."""
    if torch.autocast_decrement_nesting() == 0:
        torch.clear_autocast_cache()
    torch.set_autocast_enabled(device, prev_enabled)
    torch.set_autocast_dtype(device, prev_dtype)
    torch.set_autocast_cache_enabled(prev_cache_enabled)


class AutocastExit:
    """The `__exit__` of an autocast block that a graph break split: it sits on the resume
    function's value stack where the block's own exit was (like runtime.GradModeExit), and
    says which block it ends (`block`) and the state it goes back to (`prev`)."""

    __slots__ = ("block", "prev")

    def __init__(self, block: AutocastState, prev: AutocastState):
        self.block, self.prev = block, prev

    def __call__(self, *exc_info):
        p = self.prev
        autocast_exit(p.device, p.enabled, p.dtype, p.cache_enabled)
        return None

    def __repr__(self):
        return f"AutocastExit({self.block}, prev={self.prev})"


def block_of(ctx) -> Optional[tuple]:
    """(device, enabled, dtype, cache_enabled) of a torch.autocast object (or a subclass:
    torch.cpu.amp.autocast, torch.cuda.amp.autocast), None for anything else."""
    if not isinstance(ctx, torch.amp.autocast_mode.autocast):
        return None
    dtype = ctx.fast_dtype if ctx.fast_dtype is not None else torch.get_autocast_dtype(ctx.device)
    return (ctx.device, bool(ctx._enabled), dtype, bool(ctx._cache_enabled))


@contextlib.contextmanager
def applied(states: dict):
    """Run fake-tensor propagation under the traced autocast states (device -> AutocastState),
    without touching the nesting count; the cast cache stays off (fake tensors must not be
    cached beyond the op)."""
    saved = [AutocastState.current(d) for d in states]
    cache = torch.is_autocast_cache_enabled()
    for s in states.values():
        torch.set_autocast_enabled(s.device, s.enabled)
        torch.set_autocast_dtype(s.device, s.dtype)
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        for s in saved:
            torch.set_autocast_enabled(s.device, s.enabled)
            torch.set_autocast_dtype(s.device, s.dtype)
        torch.set_autocast_cache_enabled(cache)
