"""MTP / EAGLE-style draft head: one decoder layer tied to the target.

At position i the head reads the target's final hidden state ``h_i`` (a *feature*) and
the next token ``t_{i+1}`` and predicts the feature at i + 1, whose logits through the
target's lm_head predict ``t_{i+2}``:

    rmsnorm layout:  f = norm(layer(fc(cat(enorm(embed(t_{i+1})), hnorm(h_i)))))
    eagle1 layout:   f = layer'(fc(cat(embed(t_{i+1}), h_i)) + bias)   (layer' has no input norm)

The rmsnorm layout is DeepSeek-V3's MTP module (enorm, hnorm, eh_proj, shared_head.norm);
eagle1 is the original EAGLE head without those norms. Embedding and lm_head are the
target's tensors, shared by reference and never stored in the head.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..layers.attention import AttentionBackend
from ..layers.linear import Linear
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from .config import ModelConfig
from .llama import LlamaDecoderLayer

LAYOUTS = ("rmsnorm", "eagle1")


class MTPHead(nn.Module):
    def __init__(self, cfg: ModelConfig, layout: str = "rmsnorm"):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"MTP head layout must be one of {LAYOUTS}, got {layout!r}")
        self.config, self.layout = cfg, layout
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        norms = layout == "rmsnorm"
        self.enorm = RMSNorm(h, eps) if norms else None
        self.hnorm = RMSNorm(h, eps) if norms else None
        self.fc = Linear(2 * h, h, bias=not norms)
        self.layer = LlamaDecoderLayer(cfg, 0)
        if not norms:
            self.layer.input_layernorm = nn.Identity()
        self.norm = RMSNorm(h, eps) if norms else None
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self._shared = None  # (embed_tokens, lm_head) of the target: a tuple, so not registered

    def bind(self, target) -> "MTPHead":
        """Shares the target's embedding and lm_head (by reference; nothing is copied)."""
        if target.config.hidden_size != self.config.hidden_size:
            raise ValueError(f"MTP head hidden size {self.config.hidden_size} does not match the target's "
                             f"{target.config.hidden_size}")
        self._shared = (target.model.embed_tokens, target.lm_head)
        return self

    @property
    def vocab_size(self) -> int:
        return self._shared[1].weight.shape[0]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._shared is None:
            raise RuntimeError("MTP head is not bound to a target model (call bind(target))")
        return self._shared[0](input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
                features: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``input_ids`` (n,) = t_{i+1}, ``features`` (n, hidden) = h_i, ``positions`` (n,) = i
        -> predicted features (n, hidden) for positions i + 1."""
        e, h = self.embed(input_ids), features.to(self.fc.weight.dtype)
        if self.enorm is not None:
            e, h = self.enorm(e), self.hnorm(h)
        x = self.fc(torch.cat([e, h], dim=-1))
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        x = self.layer(x, cos, sin, attn)
        return self.norm(x) if self.norm is not None else x

    def compute_logits(self, features: torch.Tensor) -> torch.Tensor:
        """(n, hidden) -> float32 logits through the target's lm_head."""
        return self._shared[1](features).float()

    def fuse_projections(self) -> None:
        self.layer.self_attn.fuse()
        self.layer.mlp.fuse()
