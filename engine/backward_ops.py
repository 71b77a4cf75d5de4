"""The functions a backward traced into the graph calls (`loss.backward()` in a compiled
function, engine/capture/backward.py puts them in its graphs): below both the capture and the
AOT stage, which finds the loss's tangent by its mark (engine/aot/fused_backward.py)."""

from __future__ import annotations

import contextlib

import torch
import torch.fx.traceback

TANGENT_MARK = {"engine": "loss_tangent"}


def tangent_mark():
    """Tags the node that makes the loss's tangent in an FX trace (node.meta["custom"])."""
    annotate = getattr(torch.fx.traceback, "annotate", None)
    return annotate(TANGENT_MARK) if annotate is not None else contextlib.nullcontext()


def grads_of(loss: torch.Tensor, *leaves: torch.Tensor) -> tuple:
    """`loss`'s gradients for `leaves` (each is reached, so none is None), as loss.backward()
    computes them: from a tangent of ones."""
    with tangent_mark():
        ones = torch.ones_like(loss)
    return torch.autograd.grad(loss, leaves, ones)


def like_param(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The gradient as AccumulateGrad stores a first one: with the parameter's strides when
    the parameter is dense and non-overlapping, else contiguous (autograd's layout contract)."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    if is_non_overlapping_and_dense_or_false(param):
        if grad.stride() == param.stride():
            return grad
        return grad.new_empty_strided(param.shape, param.stride()).copy_(grad)
    return grad if grad.is_contiguous() else grad.clone(memory_format=torch.contiguous_format)
