"""Aten graphs as readable Python with shapes, strides and devices (the payload of the
aot_* events), like PyTorch's print_readable."""

from __future__ import annotations

import torch.fx


def readable(gm: torch.fx.GraphModule) -> str:
    return gm.print_readable(print_output=False, include_stride=True, include_device=True)
