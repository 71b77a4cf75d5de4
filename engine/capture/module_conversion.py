"""`module.to(dtype)`, `.float()`, ... inside a compiled region where nothing would change:
a router that casts its classifier to its own dtype on every call (SwitchTransformers,
`self.classifier = self.classifier.to(self.dtype)`). Module._apply would rebind every
parameter's `.data`, which the capture cannot replay; a conversion that converts nothing is
the module itself, with each tensor's dtype and device guarded so that a later real
conversion (the user calls `model.half()` between calls) compiles again."""

from __future__ import annotations

import torch

from .source import AttrSource
from .variables import ObjectVariable

_CASTS = {torch.nn.Module.float: torch.float32, torch.nn.Module.double: torch.float64,
          torch.nn.Module.half: torch.float16, torch.nn.Module.bfloat16: torch.bfloat16}
CONVERSIONS = (torch.nn.Module.to, *_CASTS)


def unchanged(tx, fn, args, kwargs):
    """The module variable where `fn(module, ...)` would leave every parameter and buffer as
    it is (guarded), else None (the caller traces the conversion as Python)."""
    mod = args[0] if args else None
    if not (isinstance(mod, ObjectVariable) and isinstance(mod.value, torch.nn.Module) and mod.source is not None):
        return None
    rest = list(args[1:]) + list(kwargs.values())
    if not all(tx.is_python_constant(a) for a in rest):
        return None
    try:
        if fn is torch.nn.Module.to:
            device, dtype, _, memory_format = torch._C._nn._parse_to(
                *[tx.as_python(a) for a in args[1:]], **{k: tx.as_python(v) for k, v in kwargs.items()})
        else:
            device, dtype, memory_format = None, _CASTS[fn], None
    except Exception:   # noqa: BLE001  (bad arguments: Python raises them as eager would)
        return None
    if memory_format is not None:
        return None
    device = torch.device(device) if device is not None else None
    named = list(mod.value.named_parameters(remove_duplicate=False)) + \
        list(mod.value.named_buffers(remove_duplicate=False))
    def converts(t):    # what a dtype applies to
        return t.is_floating_point() or t.is_complex()

    for _, t in named:
        if dtype is not None and converts(t) and t.dtype != dtype:
            return None
        if device is not None and not _same_device(t.device, device):
            return None
    for name, t in named:
        src = mod.source
        for part in name.split("."):
            src = AttrSource(src, part)
        if dtype is not None and converts(t):
            tx.out.add_guard("EQUALS_MATCH", AttrSource(src, "dtype"), t.dtype)
        if device is not None:
            tx.out.add_guard("EQUALS_MATCH", AttrSource(src, "device"), t.device)
    return mod


def _same_device(have: torch.device, want: torch.device) -> bool:
    """`to("cuda")` leaves a tensor on the current CUDA device where it is."""
    if have.type != want.type:
        return False
    return want.index is None and (have.type != "cuda" or have.index == torch.cuda.current_device()) \
        or have.index == want.index
