"""FakeTensor creation for captured inputs: the one place that decides how a real tensor
becomes a FakeTensor (static shapes for now; the shapes work extends this)."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode


def new_fake_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=True)


def make_fake(mode: FakeTensorMode, tensor: torch.Tensor, source=None) -> torch.Tensor:
    """A FakeTensor with the same metadata (sizes, strides, dtype, device, requires_grad)."""
    return mode.from_tensor(tensor, static_shapes=True)
