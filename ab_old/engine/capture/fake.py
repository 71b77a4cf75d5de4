"""FakeTensor creation for captured inputs: the one place that decides how a real tensor
becomes a FakeTensor. Symbolic sizes (dynamic shapes) are decided in engine/shapes."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ..shapes import env as _shapes_env


def new_fake_mode(owner=None) -> FakeTensorMode:
    """The fake mode of one capture; `owner` (the OutputGraph) gives its shape environment
    the user line being traced and the graph that symbols become inputs of."""
    return _shapes_env.new_fake_mode(owner)


def make_fake(mode: FakeTensorMode, tensor: torch.Tensor, source=None) -> torch.Tensor:
    """A FakeTensor with the same metadata (dtype, device, requires_grad, sizes and strides,
    symbolic where engine.shapes' policy makes a dimension dynamic)."""
    if tensor.requires_grad and tensor._is_view() and _autograd_poisoned(tensor):
        # a view made under no_grad whose base was then written in place: autograd refuses
        # to tell anything about it (`.is_leaf` raises, and torch's fake conversion asks);
        # eager uses its values and raises only if autograd is needed, so the trace takes
        # the values, as a view of the same memory that requires grad
        fake = _shapes_env.make_fake(mode, tensor.detach(), source)
        return fake.requires_grad_(True) if fake.is_leaf else fake
    return _shapes_env.make_fake(mode, tensor, source)


def _autograd_poisoned(tensor: torch.Tensor) -> bool:
    try:
        tensor.is_leaf
        return False
    except RuntimeError:
        return True
