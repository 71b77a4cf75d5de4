"""What generated wrapper modules call at run time."""

from __future__ import annotations

import ctypes

import torch


def kernel(lib: ctypes.CDLL, name: str, n_ptrs: int, n_syms: int):
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p] * n_ptrs + [ctypes.c_int64] * n_syms
    fn.restype = None
    return fn


def ensure_layout(t: torch.Tensor, size: tuple, stride: tuple, dtype: torch.dtype = None) -> torch.Tensor:
    """An extern kernel's result with the strides and dtype our kernels were generated for
    (aten may choose other strides at run time, and a few kernels return another dtype than
    their meta function says: bf16 batch norm's running stats): then we copy, never read
    memory as what it is not."""
    if t is None:   # an optional output aten skipped at run time (attention's logsumexp, ...)
        return None
    if t.stride() == stride and t.shape == size and (dtype is None or t.dtype == dtype):   # the per-call fast path
        return t
    if tuple(t.shape) != tuple(size):
        raise RuntimeError(f"extern kernel returned shape {tuple(t.shape)}, expected {tuple(size)}")
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
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
