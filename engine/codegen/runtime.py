"""What generated wrapper modules call at run time."""

from __future__ import annotations

import ctypes

import torch


def kernel(lib: ctypes.CDLL, name: str, n_ptrs: int, n_syms: int):
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p] * n_ptrs + [ctypes.c_int64] * n_syms
    fn.restype = None
    return fn


def ensure_layout(t: torch.Tensor, size: tuple, stride: tuple) -> torch.Tensor:
    """An extern kernel's result with the strides our kernels were generated for (aten
    may choose others at run time: then we copy, never read with the wrong strides)."""
    if t is None:   # an optional output aten skipped at run time (attention's logsumexp, ...)
        return None
    if tuple(t.shape) != tuple(size):
        raise RuntimeError(f"extern kernel returned shape {tuple(t.shape)}, expected {tuple(size)}")
    if all(a == b for a, b, n in zip(t.stride(), stride, size) if n > 1):
        return t
    return torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)


def meta_empty_strided(size: tuple, stride: tuple, dtype: torch.dtype, device=None) -> torch.Tensor:
    """A buffer of Triton's precompile pass, which allocates nothing: a kernel specializes
    on its pointers' 16-byte alignment, which every fresh allocation has (a meta tensor's
    address is 0), and on the dtype."""
    return torch.empty_strided(size, stride, dtype=dtype, device="meta")


class LayoutMismatch(Exception):
    """An input's strides differ from the ones the kernels were generated for."""


def expect_input(t: torch.Tensor, size: tuple, stride: tuple, mutated: bool) -> torch.Tensor:
    if t.stride() == stride and t.shape == size:     # the per-call fast path
        return t
    if all(a == b for a, b, n in zip(t.stride(), stride, size) if n > 1) and tuple(t.shape) == tuple(size):
        return t
    if mutated or tuple(t.shape) != tuple(size):
        raise LayoutMismatch
    return torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)
