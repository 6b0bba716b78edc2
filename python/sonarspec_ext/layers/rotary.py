"""Rotary position embeddings (RoPE) tables, with linear and llama3 frequency scaling
(applied by ``ops.elementwise.apply_rope``)."""
from __future__ import annotations

import contextlib
import math
from typing import Optional

import torch
from torch import nn


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[dict]) -> torch.Tensor:
    """Inverse frequencies, shape ``(head_dim // 2,)``, float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    """Applies RoPE in the rotate-half layout used by Hugging Face Llama checkpoints."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: Optional[dict] = None):
        super().__init__()
        # A model built on the meta device to be loaded gets real tables, computed on the CPU
        # (its loader moves the model where it runs; arithmetic on meta would only import
        # torch._dynamo, over a second).
        with torch.device("cpu") if torch.empty(0).is_meta else contextlib.nullcontext():
            inv_freq = rope_inv_freq(head_dim, theta, scaling)
            freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
            self.register_buffer("cos", freqs.cos(), persistent=False)
            self.register_buffer("sin", freqs.sin(), persistent=False)
        self.max_positions = max_positions

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        """``positions``: (num_tokens,) -> cos, sin of shape (num_tokens, 1, head_dim // 2)."""
        return self.cos[positions].to(dtype).unsqueeze(1), self.sin[positions].to(dtype).unsqueeze(1)
