"""MTP / EAGLE-style draft head: ``config.num_hidden_layers`` decoder layers tied to the target.

At position i the head reads the target's final hidden state ``h_i`` (a *feature*) and
the next token ``t_{i+1}`` and predicts the feature at i + 1, whose logits through the
target's lm_head predict ``t_{i+2}``:

    rmsnorm layout:  f = norm(layers(fc(cat(enorm(embed(t_{i+1})), hnorm(h_i)))))
    eagle1 layout:   f = layers'(fc(cat(embed(t_{i+1}), h_i)) + bias)   (the first layer has no input norm)

DeepSeek-V3 and EAGLE-1 heads have one layer; a deeper head buys capacity with each extra
layer's weights read once more per drafting call.
The rmsnorm layout is DeepSeek-V3's MTP module (enorm, hnorm, eh_proj, shared_head.norm);
eagle1 is the original EAGLE head without those norms. Embedding and lm_head are the
target's tensors, shared by reference and never stored in the head.

A head may also read intermediate layers of the target (EAGLE-3's fused features): with
``feature_layers`` its feature is ``h_i + fusion(norm_j(x_i^(l_j)))`` - the final state plus
a projection of the RMS-normalised residual streams after those layers - and its own
predicted features (later chain steps) stay in the space of ``h``. The projection starts
at zero, so a fused head starts as the final-state head it is initialised from.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.attention import AttentionBackend
from ..layers.linear import Linear
from ..ops.linear import kernel_linear
from ..ops.quantized import float_weight, rows_of
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from .config import ModelConfig
from .llama import LlamaDecoderLayer, check_vocab_range, vocab_logits

LAYOUTS = ("rmsnorm", "eagle1")
MAX_LAYERS = 16   # decoder layers of a head


def check_num_layers(n: int) -> None:
    """ValueError unless a head may have ``n`` decoder layers."""
    if not 1 <= n <= MAX_LAYERS:
        raise ValueError(f"an MTP head has 1 to {MAX_LAYERS} decoder layers, got {n}")


class FeatureFusion(nn.Module):
    """final (n, hidden), streams (n, len(layers), hidden) -> final + proj(cat(norm_j(stream_j)))."""

    def __init__(self, layers: Sequence[int], hidden: int, eps: float):
        super().__init__()
        self.layers = tuple(int(x) for x in layers)
        if not self.layers or min(self.layers) < 0 or len(set(self.layers)) != len(self.layers):
            raise ValueError(f"feature layers must be distinct layer indices >= 0, got {list(layers)}")
        self.norms = nn.ModuleList(RMSNorm(hidden, eps) for _ in self.layers)
        self.proj = Linear(len(self.layers) * hidden, hidden, bias=False)
        if self.proj.weight.device.type != "meta":
            nn.init.zeros_(self.proj.weight)

    def forward(self, final: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
        if streams.dim() != 3 or streams.shape[1] != len(self.layers) or streams.shape[0] != final.shape[0]:
            raise ValueError(f"expected streams of shape [{final.shape[0]}, {len(self.layers)}, hidden], "
                             f"got {list(streams.shape)}")
        weights = torch.stack([norm.weight for norm in self.norms])   # (layers, hidden): one norm call for all
        normed = F.rms_norm(streams.to(weights.dtype), weights.shape[1:], eps=self.norms[0].eps) * weights
        return final + self.proj(normed.reshape(streams.shape[0], -1)).to(final.dtype)


class MTPHead(nn.Module):
    def __init__(self, cfg: ModelConfig, layout: str = "rmsnorm", feature_layers: Sequence[int] = ()):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"MTP head layout must be one of {LAYOUTS}, got {layout!r}")
        self.config, self.layout = cfg, layout
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        norms = layout == "rmsnorm"
        self.enorm = RMSNorm(h, eps) if norms else None
        self.hnorm = RMSNorm(h, eps) if norms else None
        self.fc = Linear(2 * h, h, bias=not norms)
        check_num_layers(cfg.num_hidden_layers)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        if not norms:
            self.layers[0].input_layernorm = nn.Identity()
        self.norm = RMSNorm(h, eps) if norms else None
        self.fusion = FeatureFusion(feature_layers, h, eps) if feature_layers else None
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self._shared = None  # (embed_tokens, lm_head) of the target: a tuple, so not registered
        self.draft_vocab: Optional[torch.Tensor] = None   # token ids the head may propose (None: all)
        self._draft_lm_head: Optional[torch.Tensor] = None

    @property
    def feature_layers(self) -> Tuple[int, ...]:
        """The target layers whose outputs the head reads besides the final states."""
        return () if self.fusion is None else self.fusion.layers

    def target_features(self, final: torch.Tensor, streams: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The head's feature of target positions: ``final`` states (n, hidden), fused with
        the residual streams after ``feature_layers`` (n, len, hidden) for a fused head."""
        if self.fusion is None:
            return final
        if streams is None:
            raise ValueError(f"this head reads target layers {list(self.feature_layers)}: pass their streams")
        return self.fusion(final, streams)

    def bind(self, target) -> "MTPHead":
        """Shares the target's embedding and lm_head (by reference; nothing is copied)."""
        if target.config.hidden_size != self.config.hidden_size:
            raise ValueError(f"MTP head hidden size {self.config.hidden_size} does not match the target's "
                             f"{target.config.hidden_size}")
        if self.feature_layers and max(self.feature_layers) >= target.config.num_hidden_layers:
            raise ValueError(f"MTP head reads target layers {list(self.feature_layers)}, the target has "
                             f"{target.config.num_hidden_layers}")
        self._shared = (target.model.embed_tokens, target.lm_head)
        self.set_draft_vocab(self.draft_vocab)
        return self

    def set_draft_vocab(self, token_ids: Optional[torch.Tensor]) -> None:
        """Restricts proposals to ``token_ids`` (frequency-ranked drafting): logits are
        computed for those rows of the target's lm_head only (gathered at inference time,
        never saved) and are -inf elsewhere. Verification stays exact whatever the set."""
        self.draft_vocab = None if token_ids is None else token_ids.to(torch.long)
        if self.draft_vocab is not None and self._shared is not None:
            w = self._shared[1].weight
            check_vocab_range(self.draft_vocab, w.shape[0])
            self.draft_vocab = self.draft_vocab.to(w.device)
            self._draft_lm_head = rows_of(w, self.draft_vocab)

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
        e, h = self.embed_input(input_ids), features.to(self.compute_dtype)
        if self.enorm is not None:
            e, h = self.enorm(e), self.hnorm(h)
        x = self.fc(torch.cat([e, h], dim=-1))
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, attn)
        return self.norm(x) if self.norm is not None else x

    def embed_input(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (the target's) in the compute dtype."""
        return self.embed(input_ids).to(self.compute_dtype)

    def stack_parts(self):
        """(its decoder layers, rotary tables, final norm, (enorm, hnorm, fc)): what a native
        decoder stack runs (``runtime.native_stack``); norms None for EAGLE-1 heads."""
        return list(self.layers), self.rotary, self.norm, (self.enorm, self.hnorm, self.fc)

    def drafting_io(self):
        """(embedding, lm_head weights, their token ids or None) of the target, for drafting
        natively with the stack: with a draft vocabulary, only its rows of the lm_head and
        the token of each row; else the whole lm_head and None. None before ``bind``."""
        if self._shared is None:
            return None
        if self.draft_vocab is None:
            return self._shared[0].weight, self._shared[1].weight, None
        return self._shared[0].weight, self._draft_lm_head, self.draft_vocab

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.layers[0].post_attention_layernorm.weight.dtype

    def compute_logits(self, features: torch.Tensor) -> torch.Tensor:
        """(n, hidden) -> float32 logits through the target's lm_head (-inf outside the
        draft vocabulary when one is set)."""
        if self.draft_vocab is None or torch.is_grad_enabled():
            return self._shared[1](features).float()
        return vocab_logits(kernel_linear(features, self._draft_lm_head).float(), self.draft_vocab, self.vocab_size)

    def training_logits(self, features: torch.Tensor, vocab_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(n, hidden) -> float32 logits over ``vocab_ids`` (all tokens when None) for
        training: the lm_head rows are gathered and widened to float32 once and kept (the
        lm_head is frozen), so each step pays only the matrix products."""
        w = self._shared[1].weight
        key = (w.data_ptr(), None if vocab_ids is None else (vocab_ids.data_ptr(), vocab_ids.numel()))
        if getattr(self, "_train_lm_head_key", None) != key:
            rows = w if vocab_ids is None else rows_of(w, vocab_ids)
            self._train_lm_head, self._train_lm_head_key = float_weight(rows).contiguous(), key
        return F.linear(features.float(), self._train_lm_head)

    def fuse_projections(self) -> None:
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
