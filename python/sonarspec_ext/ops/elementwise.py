"""RMSNorm, SiLU-and-multiply and RoPE: one native call each for small float32 CPU inputs,
torch otherwise (and whenever autograd needs the graph)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _C
from .limits import NATIVE_MAX_ROWS


def _native(x: torch.Tensor, *others: torch.Tensor) -> bool:
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() >= 1
            and x.numel() <= NATIVE_MAX_ROWS * x.shape[-1] and x.is_contiguous()
            and all(t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu" for t in others)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in (x,) + others)))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2, -1) + eps) * weight`` (float32 in, float32 out)."""
    if not _native(x, weight) or weight.shape != x.shape[-1:]:
        return F.rms_norm(x, weight.shape, weight, eps)
    out = torch.empty_like(x)
    _C.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], eps)
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x (..., 2n) = [gate | up] -> silu(gate) * up (..., n)."""
    n = x.shape[-1] // 2
    if not _native(x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype)
    _C.silu_and_mul(x.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1], n)
    return out


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE: x (num_tokens, num_heads, head_dim); cos, sin (num_tokens, 1,
    head_dim // 2)."""
    if not _native(x, cos, sin) or cos.numel() * 2 != x.shape[0] * x.shape[-1]:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    out = torch.empty_like(x)
    _C.rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], x.shape[2])
    return out
