"""Paged attention for small query counts, native on the CPU (float32 queries)."""
from __future__ import annotations

from typing import Optional

import torch

from .. import _C
from .checks import DTYPE_CODES, check_tensor
from .linear import native_threads


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor,
                    page_size: int, token_seq: torch.Tensor, key_begin: torch.Tensor, key_end: torch.Tensor,
                    scale: float, tree_begin: Optional[torch.Tensor] = None,
                    tree_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q (num_tokens, num_heads, head_dim) float32 CPU; k_pool, v_pool (num_slots,
    num_kv_heads, head_dim) float32, bfloat16 or float16 (widened exactly as read), slot =
    page * page_size + offset; block_table (batch_size,
    max_pages) int64 page ids; token_seq, key_begin, key_end (num_tokens,) int64: query t
    attends to positions [key_begin[t], key_end[t]) of sequence token_seq[t]. With ``tree_begin``/``tree_mask`` (num_tokens,) int64 it also
    attends to positions tree_begin[t] + j for each bit j of tree_mask[t] (draft-tree
    ancestors; the two key sets are merged by log-sum-exp in one pass). Any number of query
    heads per KV head. Returns (num_tokens, num_heads * head_dim); a query token that
    reads no key at all is a ValueError."""
    check_tensor("q", q, dtypes=(torch.float32,), ndim=3)
    if q.device.type != "cpu":
        raise ValueError(f"paged_attention runs on the CPU; q is on {q.device}")
    T, H, D = q.shape
    check_tensor("k_pool", k_pool, dtypes=tuple(DTYPE_CODES), ndim=3, device=q.device)
    for name, t in (("k_pool", k_pool), ("v_pool", v_pool)):
        check_tensor(name, t, dtypes=(k_pool.dtype,), ndim=3, device=q.device)
        if t.shape[2] != D or H % t.shape[1]:
            raise ValueError(f"{name} has shape {list(t.shape)}: head_dim must be {D} and num_kv_heads divide {H}")
    if v_pool.shape != k_pool.shape:
        raise ValueError(f"v_pool has shape {list(v_pool.shape)}, expected {list(k_pool.shape)} like k_pool")
    check_tensor("block_table", block_table, dtypes=(torch.int64,), ndim=2, device=q.device)
    if not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, got {page_size!r}")
    if (tree_begin is None) != (tree_mask is None):
        raise ValueError("tree_begin and tree_mask go together: pass both or neither")
    tree = () if tree_mask is None else (("tree_begin", tree_begin), ("tree_mask", tree_mask))
    for name, t in (("token_seq", token_seq), ("key_begin", key_begin), ("key_end", key_end)) + tree:
        check_tensor(name, t, dtypes=(torch.int64,), ndim=1, device=q.device)
        if t.shape[0] != T:
            raise ValueError(f"{name} has {t.shape[0]} entries, expected {T} (one per query token)")
    out = torch.empty(T, H * D, dtype=torch.float32)
    no_keys = _C.paged_attention(q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), DTYPE_CODES[k_pool.dtype],
                                 block_table.data_ptr(),
                                 block_table.shape[0], block_table.shape[1], page_size,
                                 token_seq.data_ptr(), key_begin.data_ptr(), key_end.data_ptr(),
                                 0 if tree_begin is None else tree_begin.data_ptr(),
                                 0 if tree_mask is None else tree_mask.data_ptr(), out.data_ptr(), T, H,
                                 k_pool.shape[1], D, k_pool.shape[0], float(scale), native_threads())
    if no_keys:
        raise ValueError(f"paged_attention: {no_keys} query token(s) attend to no key: token_seq outside the "
                         f"block table's {block_table.shape[0]} rows, page ids outside the pool, or an empty "
                         f"key range")
    return out
