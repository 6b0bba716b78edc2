"""Llama-family decoder (Llama 2/3, Qwen2, Mistral) on packed tokens.

Parameter names follow Hugging Face ``LlamaForCausalLM`` so checkpoints load and save
without renaming. The same modules serve training (``DenseCausalAttention``) and
inference (``TorchPagedAttention`` or another backend).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.attention import AttentionBackend
from ..layers.embedding import Embedding
from ..layers.linear import Linear
from ..ops.elementwise import apply_rope, rope_qkv
from ..ops.linear import kernel_linear, kernel_mlp
from ..ops.quantized import QuantizedMatrix, rows_of
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding
from .config import ModelConfig


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        h, b = cfg.hidden_size, cfg.attention_bias
        self.q_proj = Linear(h, self.num_heads * self.head_dim, bias=b)
        self.k_proj = Linear(h, self.num_kv_heads * self.head_dim, bias=b)
        self.v_proj = Linear(h, self.num_kv_heads * self.head_dim, bias=b)
        self.o_proj = Linear(self.num_heads * self.head_dim, h, bias=False)
        self.qkv = None  # (weight, bias) fused for inference by LlamaForCausalLM.fuse_projections

    def fuse(self):
        self.qkv = _fuse([self.q_proj, self.k_proj, self.v_proj])

    def forward(self, x, cos, sin, attn: AttentionBackend):
        n = x.shape[0]
        if self.qkv is not None:
            qkv = kernel_linear(x, *self.qkv)
            fused = rope_qkv(qkv, cos, sin, self.num_heads, self.num_kv_heads, self.head_dim)   # CUDA: one launch
            if fused is not None:
                return self.o_proj(attn.attend(self.layer_idx, *fused))
            q, k, v = qkv.split(
                [self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                 self.num_kv_heads * self.head_dim], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        qk = torch.cat([q.view(n, self.num_heads, self.head_dim), k.view(n, self.num_kv_heads, self.head_dim)], 1)
        q, k = apply_rope(qk, cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        return self.o_proj(attn.attend(self.layer_idx, q, k, v))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up = None  # (weight, None) fused for inference

    def fuse(self):
        self.gate_up = _fuse([self.gate_proj, self.up_proj])

    def forward(self, x):
        if self.gate_up is not None and self.gate_up[1] is None and self.down_proj.bias is None:
            return kernel_mlp(x, self.gate_up[0], self.down_proj.weight)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _fuse(linears):
    """Concatenates the weights (and biases) of linears sharing an input into one GEMM
    operand, then points each layer's parameters at its rows of it (no extra memory;
    quantized rows that do not start on a 16-row group keep their own copy); None (nothing
    fused) for weights of different formats."""
    kinds = {m.weight.format if isinstance(m.weight, QuantizedMatrix) else m.weight.dtype for m in linears}
    if len(kinds) > 1:
        return None   # a GGUF file's mixed formats: the projections stay separate
    quantized = isinstance(linears[0].weight, QuantizedMatrix)
    if quantized:
        weight = QuantizedMatrix.cat([m.weight for m in linears])
    else:
        weight = torch.cat([m.weight.detach() for m in linears])
    bias = None
    if linears[0].bias is not None:
        bias = torch.cat([m.bias.detach() for m in linears])
    row = 0
    for m in linears:
        rows = m.weight.shape[0]
        if quantized:
            view = weight.row_view(row, row + rows)
            if view is not None:
                m.weight = view
        else:
            m.weight = nn.Parameter(weight[row:row + rows], requires_grad=False)
        if bias is not None:
            m.bias = nn.Parameter(bias[row:row + rows], requires_grad=False)
        row += rows
    return weight, bias


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, attn):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


def is_ascending(ids: torch.Tensor) -> bool:
    """Whether the 1-D ``ids`` strictly increase (a draft vocabulary: its ties break as argmax's)."""
    return ids.numel() < 2 or bool((ids[1:] > ids[:-1]).all())


def check_vocab_range(ids: torch.Tensor, vocab_size: int) -> None:
    """A ValueError unless every token id of a draft vocabulary lies in [0, vocab_size)."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"draft vocabulary ids must lie in [0, {vocab_size})")


def vocab_logits(row_logits: torch.Tensor, row_ids: Optional[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """Logits over the lm_head rows ``row_ids`` (a draft vocabulary) as logits over the whole
    vocabulary, -inf elsewhere; ``row_ids`` None: already whole."""
    if row_ids is None:
        return row_logits
    out = row_logits.new_full((row_logits.shape[0], vocab_size), float("-inf"))
    out[:, row_ids] = row_logits
    return out


def _embedding(num: int, dim: int) -> Embedding:
    """An embedding table; on the meta device (a model about to be loaded) without the random
    initialisation, whose meta ``normal_`` imports ``torch._dynamo`` (over a second)."""
    if torch.empty(0).is_meta:
        return Embedding(num, dim, _weight=torch.empty(num, dim))
    return Embedding(num, dim)


class LlamaBackbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = _embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaBackbone(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings,
                                      cfg.rope_theta, cfg.rope_scaling)
        self.draft_vocab: Optional[torch.Tensor] = None   # token ids of the lm_head's rows (None: all)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionBackend, capture: Sequence[int] = ()):
        """``input_ids``, ``positions``: (num_tokens,) -> final-norm hidden states
        (num_tokens, hidden_size). Logits are computed separately, only where needed.
        ``capture``: layer indices whose output residual streams a drafter reads; then
        (final, (num_tokens, len(capture), hidden_size))."""
        x = self.embed_input(input_ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        streams = {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, attn)
            if i in capture:
                streams[i] = x
        if not capture:
            return self.model.norm(x)
        if any(i not in streams for i in capture):
            raise ValueError(f"captured layers {list(capture)} must lie in [0, {len(self.model.layers)})")
        return self.model.norm(x), torch.stack([streams[i] for i in capture], dim=1)

    def embed_input(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings in the compute dtype: what the decoder layers read."""
        return self.model.embed_tokens(input_ids).to(self.compute_dtype)

    def stack_parts(self):
        """(decoder layers, rotary tables, final norm, input projection or None): what a
        native decoder stack runs (``runtime.native_stack``)."""
        return self.model.layers, self.rotary, self.model.norm, None

    def use_draft_vocab(self, token_ids: torch.Tensor, lm_head) -> None:
        """A draft model proposing only ``token_ids`` (ascending): its lm_head becomes those
        rows of ``lm_head`` (a full lm_head's weight, a tensor or quantized) and its logits
        are -inf elsewhere. Inference only."""
        if token_ids.dim() != 1 or not is_ascending(token_ids):
            raise ValueError("a draft vocabulary is a 1-D tensor of ascending token ids")
        check_vocab_range(token_ids, self.config.vocab_size)
        rows = rows_of(lm_head, token_ids)
        with torch.device("meta"):   # no storage: its weight is replaced by the rows
            self.lm_head = Linear(self.config.hidden_size, token_ids.shape[0], bias=False)
        del self.lm_head._parameters["weight"]
        self.lm_head.weight = rows
        self.draft_vocab = token_ids.to(torch.long).contiguous()

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def drafting_io(self):
        """(embedding, lm_head weights, the token of each lm_head row or None: row r is token
        r), for drafting natively with the stack."""
        return self.model.embed_tokens.weight, self.lm_head.weight, self.draft_vocab

    @property
    def compute_dtype(self) -> torch.dtype:
        """Activation dtype (weight matrices may be stored more compactly, see the loader)."""
        return self.model.norm.weight.dtype

    def fuse_projections(self) -> None:
        """Inference only: q/k/v and gate/up projections run as one GEMM each."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(num_selected, hidden_size) -> float32 logits (num_selected, vocab_size)."""
        return vocab_logits(self.lm_head(hidden).float(), self.draft_vocab, self.config.vocab_size)
