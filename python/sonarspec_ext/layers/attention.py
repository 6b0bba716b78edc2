"""Attention backends.

Every backend implements ``attend(layer_idx, q, k, v) -> out`` on packed tokens:
``q`` (num_tokens, num_heads, head_dim), ``k``/``v`` (num_tokens, num_kv_heads, head_dim),
``out`` (num_tokens, num_heads * head_dim). The model code is the same for training
(dense causal batches) and inference (paged KV cache).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ..ops import kv_store, paged_attention


class AttentionBackend:
    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def segment_mask(segments: torch.Tensor) -> torch.Tensor:
    """(B, T) segment ids of packed training windows -> (B, 1, T, T) bool: query and key in
    one segment."""
    return (segments[:, :, None] == segments[:, None, :])[:, None]


class DenseCausalAttention(AttentionBackend):
    """Causal attention over ``batch_size`` equal-length sequences, no cache (training).
    ``segments`` (batch_size, seq_len): packed windows whose tokens attend within their own
    segment only (None: each window one sequence)."""

    def __init__(self, batch_size: int, seq_len: int, segments: Optional[torch.Tensor] = None):
        self.batch_size, self.seq_len = batch_size, seq_len
        self.mask = None
        if segments is not None:
            causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=segments.device).tril()
            self.mask = causal & segment_mask(segments)

    def attend(self, layer_idx, q, k, v):
        B, T = self.batch_size, self.seq_len
        q, k, v = (t.view(B, T, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.mask is None, attn_mask=self.mask,
                                             enable_gqa=True)
        return out.transpose(1, 2).reshape(B * T, -1)


@dataclass
class PagedAttentionMetadata:
    """Per-step metadata shared by all layers (built once per step).

    slot_mapping:   (num_tokens,) KV slot (page_id * page_size + offset) for each new token.
    query_index:    (batch_size, max_query_len) packed-token index of each query, padded.
    block_table:    (batch_size, max_pages) page ids of each sequence, padded; page_size.
    kv_slots:       (batch_size, max_kv_len) slot of each cached position, padded: only for
                    the SDPA path (None when ``native`` is set).
    mask:           (batch_size, 1, max_query_len, max_kv_len) bool, or None when every
                    query may see every key (uniform single-token decode).
    output_index:   (num_tokens,) row of the flattened (batch_size * max_query_len) output
                    holding each packed token.
    uniform_queries: every sequence has max_query_len queries, so the packed tokens are
                    already a (batch_size, max_query_len) grid and no gather is needed.
    native:         (token_seq, key_begin, key_end[, tree_begin, tree_mask]), each
                    (num_tokens,): for small float32 CPU steps, the key range (and draft-tree
                    ancestor bits) of every query for ``ops.paged_attention`` (then ``mask``
                    is None and not needed).
    """
    slot_mapping: torch.Tensor
    query_index: torch.Tensor
    block_table: torch.Tensor
    page_size: int
    kv_slots: Optional[torch.Tensor]
    mask: Optional[torch.Tensor]
    output_index: torch.Tensor
    uniform_queries: bool = False
    native: Optional[tuple] = None


class TorchPagedAttention(AttentionBackend):
    """Paged attention (CPU and CUDA): writes new K/V into the page pool, then, where the
    metadata holds per-token key lists (float32 CPU steps, CUDA steps the kernel takes),
    runs ``ops.paged_attention`` on the pool directly; otherwise gathers each sequence's
    cached K/V and runs one masked SDPA for the whole batch."""

    def __init__(self, kv_cache, meta: PagedAttentionMetadata):
        self.kv_cache, self.meta = kv_cache, meta

    def attend(self, layer_idx, q, k, v):
        m = self.meta
        k_pool, v_pool = self.kv_cache.layer(layer_idx)
        kv_store(k_pool, v_pool, k.to(k_pool.dtype).contiguous(), v.to(v_pool.dtype).contiguous(),
                 m.slot_mapping)
        if m.native is not None:   # key lists: no mask to fall back on
            token_seq, key_begin, key_end, *tree = m.native
            tree_begin, tree_mask = tree or (None, None)
            return paged_attention(q.contiguous(), k_pool, v_pool, m.block_table, m.page_size, token_seq, key_begin,
                                   key_end, q.shape[-1] ** -0.5, tree_begin, tree_mask, check=not q.is_cuda)
        B, Lq = m.query_index.shape
        qb = q.view(B, Lq, *q.shape[1:]) if m.uniform_queries else q[m.query_index]
        qb = qb.transpose(1, 2)                                      # (B, H, Lq, D)
        kb = k_pool[m.kv_slots].transpose(1, 2).to(q.dtype)          # (B, Hkv, Lk, D)
        vb = v_pool[m.kv_slots].transpose(1, 2).to(q.dtype)
        out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=m.mask, enable_gqa=True)
        out = out.transpose(1, 2).reshape(B * Lq, -1)
        return out if m.uniform_queries else out[m.output_index]
