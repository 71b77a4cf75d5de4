"""The `eager` backend: run the captured FX graph as Python (GraphModule.forward)."""

from __future__ import annotations

from .registry import register_backend


@register_backend("eager")
def eager(gm, example_inputs):
    return gm.forward
