"""The decomposition table handed to the AOT stage: torch's core-aten decompositions plus
the composite ops (softmax, layer/batch/group norm, gelu, var, addmm, ...) that our
lowerings build from pointwise ops and reductions. Random ops are kept whole so they draw
from the generator exactly as eager does (they run as extern kernels)."""

from __future__ import annotations

import functools

import torch
import torch._decomp
from torch._decomp import core_aten_decompositions, get_decompositions

from .foreach import foreach_decompositions

aten = torch.ops.aten

_EXTRA = [
    aten.gelu, aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.native_batch_norm,
    aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
    aten._native_batch_norm_legit, aten.addmm, aten.clamp, aten.hardtanh,
    aten.leaky_relu, aten.elu, aten.native_group_norm, aten._fused_rms_norm, aten.rsqrt.default,
    aten.sign, aten.logsumexp, aten.cumsum.default, aten.linalg_vector_norm, aten.rms_norm, aten.var_mean, aten.std, aten.std_mean,
]

# Kept whole: random ops (same generator stream as eager), ops we lower directly and whose
# decompositions would be slower or change numerics, and the fused attention kernels
# (extern calls): torch's decomposition of a flash-attention forward returns the attention
# weights where the kernel returns its logsumexp, which the backward kernel (never
# decomposed) reads, so a decomposed forward gives wrong gradients.
_KEEP = {
    aten.bernoulli.default, aten.native_dropout.default, aten.rand_like.default, aten.randn_like.default,
    aten.rsqrt.default, aten.sign.default, aten.cumsum.default,
    aten.arange.default, aten.arange.start,
    # their results share the input's memory, as eager's do (torch's decomposition copies)
    aten.unsafe_split.Tensor, aten.unsafe_split_with_sizes.default,
} | {getattr(aten, name).default for name in (
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable") if hasattr(aten, name)}


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    """Two reductions (mean, then the sum of squared deviations) that fuse into one kernel:
    torch's own decomposition goes through prims we do not lower."""
    dims = list(range(x.dim())) if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0) else (
        [dim] if isinstance(dim, int) else list(dim))
    correction = 1 if correction is None else correction
    n = 1
    for d in dims:
        n = n * x.shape[d]
    src = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
    mean = torch.sum(src, dims, keepdim=True) / n
    # one element: its deviation is exactly 0 in eager (0/0 = nan with a correction); src is
    # recomputed in the other loop, where vector and scalar math may differ in the last bit
    diff = src - src if isinstance(n, int) and n == 1 else src - mean
    var = torch.sum(diff * diff, dims, keepdim=keepdim) / max(0, n - correction)
    if not keepdim:
        mean = torch.squeeze(mean, dims)
    return var.to(x.dtype), mean.to(x.dtype)


def _var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def _std(x, dim=None, *, correction=None, keepdim=False):
    return torch.sqrt(_var(x, dim, correction=correction, keepdim=keepdim))


def _std_mean(x, dim=None, *, correction=None, keepdim=False):
    var, mean = _var_mean(x, dim, correction=correction, keepdim=keepdim)
    return torch.sqrt(var), mean


def _mean(x, dim=None, keepdim=False, *, dtype=None):
    src = x.to(dtype) if dtype is not None else x
    if x.dim() == 0:   # dim 0 / -1 of a 0-d tensor is the tensor itself
        return src.clone()
    dims = list(range(x.dim())) if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0) else (
        [dim] if isinstance(dim, int) else list(dim))
    n = 1
    for d in dims:
        n = n * x.shape[d]
    low = src.dtype in (torch.bfloat16, torch.float16)
    total = torch.sum(src.float() if low else src, dims, keepdim=keepdim)
    return (total / n).to(src.dtype)


def _mean_all(x, *, dtype=None):
    return _mean(x, None, False, dtype=dtype)


def _unbiased_dim(fn, x, dim, unbiased=True, keepdim=False):
    return fn(x, dim, correction=1 if unbiased else 0, keepdim=keepdim)


def _unbiased_all(fn, x, unbiased=True):
    return fn(x, None, correction=1 if unbiased else 0)


def _addmm(decomposed, self, mat1, mat2, *, beta=1, alpha=1):
    """torch's addmm decomposition computes bf16/fp16 in fp32 (an fp32 matmul, many times
    slower on GPUs, with the weights cast every call): keep low-precision addmm whole, as
    one BLAS call with its fused bias and eager's single rounding."""
    if mat1.dtype in (torch.bfloat16, torch.float16):
        return NotImplemented
    return decomposed(self, mat1, mat2, beta=beta, alpha=alpha)


def _gelu(decomposed, x, approximate="none"):
    """Exact GELU stays whole: the lowerings build it from the normal CDF, an op each
    backend makes cheap (GELU after a LayerNorm is bound by instructions on GPUs, and
    erf is most of them); the tanh form decomposes."""
    if approximate == "none":
        return NotImplemented
    return decomposed(x, approximate=approximate)


def _int_with_float_value(decomposed, self, *args, value=1, **kwargs):
    """torch's reference decomposition of addcmul refuses a float `value` on an integer
    tensor (ValueError: cannot be safely cast), where eager truncates it and computes: such
    a call stays whole, run by aten with eager's result (fuzz 403580)."""
    if isinstance(value, float) and not (self.dtype.is_floating_point or self.dtype.is_complex):
        return NotImplemented
    return decomposed(self, *args, value=value, **kwargs)


def _core_aten() -> dict:
    """Core-aten decompositions without the CompositeImplicitAutograd entries: those ops
    decompose by themselves while the AOT stage traces, and listing them makes torch
    enumerate every such op in the registry (~0.2 s of the first compile)."""
    post_autograd = getattr(torch._decomp, "_core_aten_decompositions_post_autograd", None)
    return dict(post_autograd() if post_autograd is not None else core_aten_decompositions())


@functools.lru_cache(None)
def decomposition_table() -> dict:
    table = _core_aten()
    table.update(get_decompositions(_EXTRA))
    table[aten.mean.dim] = _mean
    table[aten.addmm.default] = functools.partial(_addmm, table[aten.addmm.default])
    table[aten.mean.default] = _mean_all
    table[aten.gelu.default] = functools.partial(_gelu, table[aten.gelu.default])
    for op in (aten.addcmul.default, aten.addcmul_.default):
        if op in table:
            table[op] = functools.partial(_int_with_float_value, table[op])
    table.update(foreach_decompositions())
    for packet, fn in ((aten.var_mean, _var_mean), (aten.var, _var), (aten.std, _std), (aten.std_mean, _std_mean)):
        table[packet.correction] = fn
        table[packet.dim] = functools.partial(_unbiased_dim, fn)
        table[packet.default] = functools.partial(_unbiased_all, fn)
    for op in list(table):
        if op in _KEEP:
            del table[op]
    return table
