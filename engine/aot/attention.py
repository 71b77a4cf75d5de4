"""Which kernel a masked attention runs on a GPU.

`F.scaled_dot_product_attention` picks its kernel when it is called. Traced on fake CUDA
tensors with an `attn_mask` (BERT's padding mask, GPT-2's causal mask, as transformers
builds them under a compiler), it picks the math path: the scores as a float32 [batch,
heads, queries, keys] matrix, two bmms and a softmax; BERT-base at 16x256 kept 48 MiB
buffers of them alive and ran slower than torch.compile, which matches that pattern back
into a fused kernel. Here the AOT stage calls a fused kernel itself, with the mask as an
additive bias: cuDNN's where torch says cuDNN runs the call (as torch.compile's trace picks
on an H200: GPT-2-small's twelve masked attentions take 0.41 ms there against 1.16 in the
memory-efficient kernel), else PyTorch's memory-efficient kernel (its bias laid out as
`F.scaled_dot_product_attention` lays it out for it) wherever that kernel supports the call;
anything else is left to torch's own choice."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ATTENTION = frozenset({F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention})
_ALIGNMENT = 16     # the kernel's: the bias's row stride a multiple of 16 elements


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    if _cudnn_fits(query, key, value, attn_mask, dropout_p, is_causal):
        bias = attn_mask
        if bias.dtype == torch.bool:     # as eager converts it for cuDNN
            bias = torch.where(bias, torch.zeros((), dtype=query.dtype, device=query.device),
                               torch.full((), -math.inf, dtype=query.dtype, device=query.device))
        needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return torch.ops.aten._scaled_dot_product_cudnn_attention(
            query, key, value, bias, needs_lse, 0.0, False, False, scale=scale)[0]
    if not _efficient_kernel_fits(query, key, value, attn_mask, dropout_p, is_causal):
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    bias = additive_bias(attn_mask, query, key)
    needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, needs_lse, 0.0, False, scale=scale)[0]


def additive_bias(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The mask as the kernel's bias: -inf where a bool mask is False, in the query's dtype,
    broadcast to [batch, heads, queries, keys]; its rows padded to the kernel's alignment
    and made dense where they are not."""
    if mask.dtype == torch.bool:
        mask = torch.where(mask, torch.zeros((), dtype=query.dtype, device=query.device),
                           torch.full((), -math.inf, dtype=query.dtype, device=query.device))
    bias = mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    keys = bias.shape[-1]
    if bias.stride(-1) != 1 or keys % _ALIGNMENT:
        padded = F.pad(bias, (0, -keys % _ALIGNMENT))
        bias = padded[..., :keys]
    if any(s == 0 or s % _ALIGNMENT for s in bias.stride()[:3]):
        bias = bias.contiguous()
    return bias


def _cudnn_fits(query, key, value, mask, dropout_p, is_causal) -> bool:
    """A masked attention cuDNN runs, by torch's own check of these (fake) tensors."""
    if not isinstance(mask, torch.Tensor) or mask.requires_grad or dropout_p or is_causal:
        return False
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cuda" and t.dim() == 4 for t in (query, key, value)):
        return False
    if mask.dtype not in (torch.bool, query.dtype) or key.shape[1] != query.shape[1] \
            or value.shape[1] != query.shape[1] or not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    try:
        params = torch.backends.cuda.SDPAParams(query, key, value, mask, 0.0, False, False)
        return bool(torch.backends.cuda.can_use_cudnn_attention(params))
    except (RuntimeError, TypeError):     # another torch's signature, a fake tensor it cannot read
        return False


def _efficient_kernel_fits(query, key, value, mask, dropout_p, is_causal) -> bool:
    tensors = (query, key, value)
    if mask is None or not isinstance(mask, torch.Tensor) or mask.requires_grad:
        return False     # unmasked attention already gets a fused kernel
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cuda" and t.dim() == 4 for t in tensors):
        return False
    if not torch.backends.cuda.mem_efficient_sdp_enabled() or dropout_p or is_causal:
        return False
    dtype = query.dtype
    if dtype not in (torch.float16, torch.bfloat16) or key.dtype != dtype or value.dtype != dtype:
        return False
    if mask.dtype not in (torch.bool, dtype):
        return False
    heads = query.shape[1]
    if key.shape[1] != heads or value.shape[1] != heads:     # grouped-query attention: torch's choice
        return False
    d, dv = query.shape[-1], value.shape[-1]
    if key.shape[-1] != d or d % 8 or dv % 8 or max(d, dv) > 128 or any(t.stride(-1) != 1 for t in tensors):
        return False
    try:
        torch.broadcast_shapes(mask.shape, (query.shape[0], heads, query.shape[2], key.shape[2]))
    except RuntimeError:
        return False
    return True
