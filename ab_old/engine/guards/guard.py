"""The guard record. A guard is plain data: a kind, the source expression it reads
(valid Python given dicts `L` and `G`), what it expects, and the user line that made
the capture rely on it."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
import torch.utils._device as _utils_device

UserFrame = tuple  # (filename, lineno, name, line)


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    type: type
    dtype: torch.dtype
    device: torch.device
    sizes: tuple
    strides: tuple
    requires_grad: bool

    @staticmethod
    def of(t: torch.Tensor) -> "TensorMeta":
        return TensorMeta(type(t), t.dtype, t.device, tuple(t.size()), tuple(t.stride()), t.requires_grad)


@dataclasses.dataclass(frozen=True)
class Guard:
    kind: str            # TENSOR_MATCH, TYPE_MATCH, ID_MATCH, EQUALS_MATCH, LENGTH_CHECK, DICT_KEYS,
                         # HASATTR, GLOBAL_STATE, DUPLICATE_INPUT, NO_TENSOR_ALIASING
    source: str          # "L['x']", "G['w']", "L['self'].layer.weight", "" for GLOBAL_STATE
                         # and NO_TENSOR_ALIASING (whose expected is the tuple of its sources)
    expected: Any        # TensorMeta, a type, an object, a value, a length, a key list, a bool, a dict
    user_frame: Optional[UserFrame] = None

    def key(self):
        exp = self.expected
        try:
            hash(exp)
        except TypeError:
            exp = repr(exp)
        if self.kind == "ID_MATCH":
            exp = id(self.expected)
        return (self.kind, self.source, type(self.expected).__name__, exp)


def global_state_tuple() -> tuple:
    """global_state().values(), cheaply: this runs on every cache hit."""
    if _autocast_takes_device():
        return (torch.is_grad_enabled(), str(torch.get_default_dtype()), torch.are_deterministic_algorithms_enabled(),
                torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"), torch.is_inference_mode_enabled(),
                _utils_device.CURRENT_DEVICE)
    return (torch.is_grad_enabled(), str(torch.get_default_dtype()), torch.are_deterministic_algorithms_enabled(),
            torch.is_autocast_cpu_enabled(), torch.is_autocast_enabled(), torch.is_inference_mode_enabled(),
            _utils_device.CURRENT_DEVICE)


def global_state() -> dict:
    """The global torch state a graph depends on (what PyTorch's GLOBAL_STATE guard checks)."""
    return {
        "grad_mode": torch.is_grad_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "autocast_cpu": torch.is_autocast_enabled("cpu") if _autocast_takes_device() else torch.is_autocast_cpu_enabled(),
        "autocast_cuda": torch.is_autocast_enabled("cuda") if _autocast_takes_device() else torch.is_autocast_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        # torch.set_default_device(...) (PyTorch's DEFAULT_DEVICE guard reads the same variable)
        "default_device": _utils_device.CURRENT_DEVICE,
    }


_AUTOCAST_DEVICE_ARG = None


def _autocast_takes_device() -> bool:
    global _AUTOCAST_DEVICE_ARG
    if _AUTOCAST_DEVICE_ARG is None:
        try:
            torch.is_autocast_enabled("cpu")
            _AUTOCAST_DEVICE_ARG = True
        except TypeError:
            _AUTOCAST_DEVICE_ARG = False
    return _AUTOCAST_DEVICE_ARG
