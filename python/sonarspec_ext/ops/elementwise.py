"""RMSNorm, SiLU-and-multiply and RoPE: one native call each for small float32 CPU inputs,
one CUDA launch each for CUDA tensors (``csrc/kernels/cuda/elementwise.cu``), torch
otherwise (and whenever autograd needs the graph)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .. import _C
from .checks import DTYPE_CODES, built_with_cuda, stream_handle
from .limits import NATIVE_MAX_ROWS

_RMS_NORM, _SILU_AND_MUL, _ROPE_QKV = 0, 1, 2


def on_cuda(x: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether the CUDA kernels take ``x`` (and ``others``, of its dtype): CUDA builds,
    float32 / float16 / bfloat16 tensors on one device, no autograd graph needed."""
    return (x.is_cuda and built_with_cuda() and x.dtype in DTYPE_CODES
            and all(t.device == x.device and t.dtype == x.dtype and t.is_contiguous() for t in others)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in (x,) + others)))


def _launch(op: int, x: torch.Tensor, out: torch.Tensor, rows: int, n: int, w=None, cos=None, sin=None,
            out2=None, out3=None, stride: int = 0, heads: int = 0, kv_heads: int = 0, eps: float = 0.0) -> None:
    ptr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
    _C.elementwise_cuda(op, x.data_ptr(), ptr(w), ptr(cos), ptr(sin), out.data_ptr(), ptr(out2), ptr(out3), rows, n,
                        stride, heads, kv_heads, float(eps), DTYPE_CODES[x.dtype], stream_handle(x.device))


def _native(x: torch.Tensor, *others: torch.Tensor) -> bool:
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() >= 1 and x.numel() > 0
            and x.numel() <= NATIVE_MAX_ROWS * x.shape[-1] and x.is_contiguous()
            and all(t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu" for t in others)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in (x,) + others)))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * round(x * rsqrt(mean(x^2, -1) + eps))`` in x's dtype (the normalised row
    rounded to it before the weight multiplies, as the reference Llama RMSNorm; float32:
    no rounding). CUDA tensors with a weight of their dtype: one launch; float32 CPU
    inputs: native or ``F.rms_norm``."""
    if x.dim() == 0 or weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm takes a weight of shape {list(x.shape[-1:])} for x of shape {list(x.shape)}, "
                         f"got {list(weight.shape)}")
    if on_cuda(x, weight) and x.is_contiguous() and x.numel():
        out = torch.empty_like(x)
        _launch(_RMS_NORM, x, out, x.numel() // x.shape[-1], x.shape[-1], w=weight, eps=eps)
        return out
    if not _native(x, weight):
        return F.rms_norm(x, weight.shape, weight, eps)
    out = torch.empty_like(x)
    _C.rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], eps)
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x (..., 2n) = [gate | up] -> silu(gate) * up (..., n)."""
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul takes [gate | up] rows of even width, got shape {list(x.shape)}")
    n = x.shape[-1] // 2
    if on_cuda(x) and x.is_contiguous() and x.numel():
        out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
        _launch(_SILU_AND_MUL, x, out, x.numel() // x.shape[-1], n)
        return out
    if not _native(x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype)
    _C.silu_and_mul(x.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1], n)
    return out


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE: x (num_tokens, num_heads, head_dim); cos, sin (num_tokens, 1,
    head_dim // 2)."""
    if x.dim() != 3 or x.shape[-1] % 2 or cos.shape != (x.shape[0], 1, x.shape[-1] // 2) or sin.shape != cos.shape:
        raise ValueError(f"apply_rope takes x (tokens, heads, even head_dim) and cos, sin (tokens, 1, head_dim / 2), "
                         f"got {list(x.shape)}, {list(cos.shape)}, {list(sin.shape)}")
    if not _native(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    out = torch.empty_like(x)
    _C.rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], x.shape[2])
    return out


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int, head_dim: int
             ) -> Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The fused q/k/v GEMM's rows (num_tokens, (heads + 2 kv_heads) * head_dim) -> q
    (num_tokens, heads, head_dim) and k (num_tokens, kv_heads, head_dim) rotated as
    ``apply_rope`` does and v (num_tokens, kv_heads, head_dim), each contiguous, in one
    CUDA launch; None where the kernel does not apply (CPU tensors, other layouts)."""
    n, width = qkv.shape[0], (heads + 2 * kv_heads) * head_dim
    if (qkv.dim() != 2 or qkv.shape[1] != width or qkv.stride(1) != 1 or head_dim % 2 or n == 0
            or not on_cuda(qkv, cos, sin) or cos.numel() != n * head_dim // 2 or sin.numel() != cos.numel()):
        return None
    q = torch.empty(n, heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    k = torch.empty(n, kv_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    v = torch.empty_like(k)
    _launch(_ROPE_QKV, qkv, q, n, head_dim, cos=cos, sin=sin, out2=k, out3=v, stride=qkv.stride(0), heads=heads,
            kv_heads=kv_heads)
    return q, k, v
