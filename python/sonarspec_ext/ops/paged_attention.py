"""Paged attention over per-token key lists: native on the CPU (float32 queries) and on
CUDA (queries of the pool's dtype)."""
from __future__ import annotations

from typing import Optional

import torch

from .. import _C
from .checks import DTYPE_CODES, built_with_cuda, check_page_size, check_tensor, stream_handle
from .linear import native_threads


def cuda_attention_supports(head_dim: int) -> bool:
    """Whether this build runs ``paged_attention`` on CUDA tensors of this head size."""
    return built_with_cuda() and bool(_C.paged_attention_cuda_supports(head_dim))


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor,
                    page_size: int, token_seq: torch.Tensor, key_begin: torch.Tensor, key_end: torch.Tensor,
                    scale: float, tree_begin: Optional[torch.Tensor] = None,
                    tree_mask: Optional[torch.Tensor] = None, check: bool = True) -> torch.Tensor:
    """q (num_tokens, num_heads, head_dim) float32 CPU, or any float dtype on CUDA; k_pool,
    v_pool (num_slots, num_kv_heads, head_dim) float32, bfloat16 or float16 (widened exactly
    as read), slot = page * page_size + offset; block_table (batch_size, max_pages) int64
    page ids; token_seq, key_begin, key_end (num_tokens,) int64: query t attends to
    positions [key_begin[t], key_end[t]) of sequence token_seq[t]. With
    ``tree_begin``/``tree_mask`` (num_tokens,) int64 it also attends to positions tree_begin[t] + j for each bit j of tree_mask[t] (draft-tree
    ancestors; the two key sets are merged by log-sum-exp in one pass). Any number of query
    heads per KV head. Returns (num_tokens, num_heads * head_dim) in q's dtype; a query
    token that reads no key at all (or whose indices leave the table or the pool) is a
    ValueError. On CUDA (``cuda_attention_supports``: head_dim 32, 64, 96, 128 or 256),
    ``check`` False skips that test - it reads a counter back from the device - and such a
    token's output is zero."""
    check_tensor("q", q, dtypes=(torch.float32, torch.float16, torch.bfloat16) if q.is_cuda else (torch.float32,),
                 ndim=3)
    T, H, D = q.shape
    check_tensor("k_pool", k_pool, dtypes=tuple(DTYPE_CODES), ndim=3, device=q.device)
    for name, t in (("k_pool", k_pool), ("v_pool", v_pool)):
        check_tensor(name, t, dtypes=(k_pool.dtype,), ndim=3, device=q.device)
        if t.shape[2] != D or H % t.shape[1]:
            raise ValueError(f"{name} has shape {list(t.shape)}: head_dim must be {D} and num_kv_heads divide {H}")
    if v_pool.shape != k_pool.shape:
        raise ValueError(f"v_pool has shape {list(v_pool.shape)}, expected {list(k_pool.shape)} like k_pool")
    check_tensor("block_table", block_table, dtypes=(torch.int64,), ndim=2, device=q.device)
    check_page_size(page_size)
    if block_table.shape[1] * page_size >= 1 << 63:
        raise ValueError(f"a block table of {block_table.shape[1]} pages of {page_size} positions spans 2^63 "
                         f"positions or more")
    if (tree_begin is None) != (tree_mask is None):
        raise ValueError("tree_begin and tree_mask go together: pass both or neither")
    tree = () if tree_mask is None else (("tree_begin", tree_begin), ("tree_mask", tree_mask))
    for name, t in (("token_seq", token_seq), ("key_begin", key_begin), ("key_end", key_end)) + tree:
        check_tensor(name, t, dtypes=(torch.int64,), ndim=1, device=q.device)
        if t.shape[0] != T:
            raise ValueError(f"{name} has {t.shape[0]} entries, expected {T} (one per query token)")
    if q.is_cuda:
        return _paged_attention_cuda(q, k_pool, v_pool, block_table, page_size, token_seq, key_begin, key_end, scale,
                                     tree_begin, tree_mask, check)
    out = torch.empty(T, H * D, dtype=torch.float32)
    no_keys = paged_attention_cpu_into(out, q, k_pool, v_pool, block_table, page_size, token_seq, key_begin, key_end,
                                       scale, tree_begin, tree_mask)
    if no_keys:
        _bad_tokens(no_keys, block_table)
    return out


def paged_attention_cpu_into(out: torch.Tensor, q, k_pool, v_pool, block_table, page_size: int, token_seq,
                             key_begin, key_end, scale: float, tree_begin=None, tree_mask=None) -> int:
    """The CPU kernel of ``paged_attention`` writing into ``out`` (num_tokens, num_heads *
    head_dim) float32, with none of its argument checks - for arguments it has accepted,
    as when a benchmark times the kernel alone; returns the count of tokens that read no key."""
    T, H, D = q.shape
    return _C.paged_attention(q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), DTYPE_CODES[k_pool.dtype],
                              block_table.data_ptr(), block_table.shape[0], block_table.shape[1], page_size,
                              token_seq.data_ptr(), key_begin.data_ptr(), key_end.data_ptr(),
                              0 if tree_begin is None else tree_begin.data_ptr(),
                              0 if tree_mask is None else tree_mask.data_ptr(), out.data_ptr(), T, H,
                              k_pool.shape[1], D, k_pool.shape[0], float(scale), native_threads())


def _bad_tokens(n: int, block_table: torch.Tensor):
    raise ValueError(f"paged_attention: {n} query token(s) attend to no key: token_seq outside the "
                     f"block table's {block_table.shape[0]} rows, page ids outside the pool, or an empty "
                     f"key range")


def _paged_attention_cuda(q, k_pool, v_pool, block_table, page_size, token_seq, key_begin, key_end, scale,
                          tree_begin, tree_mask, check):
    T, H, D = q.shape
    if not cuda_attention_supports(D):
        raise ValueError(f"paged_attention on CUDA takes head_dim 32, 64, 96, 128 or 256 in a CUDA build, got {D}")
    if k_pool.shape[0] % page_size:
        raise ValueError(f"k_pool's {k_pool.shape[0]} slots are not whole pages of {page_size}")
    if k_pool.data_ptr() % 16 or v_pool.data_ptr() % 16:
        raise ValueError("paged_attention on CUDA reads the pools in 16-byte words: k_pool and v_pool must start "
                         "16-byte aligned")
    qc = q.to(k_pool.dtype).contiguous()
    out = torch.empty(T, H * D, dtype=k_pool.dtype, device=q.device)
    splits = int(_C.paged_attention_cuda_max_splits(block_table.shape[1], page_size))
    partial = torch.empty(T * H * splits * (D + 2) if splits > 1 else 1, dtype=torch.float32, device=q.device)
    splits_used = torch.empty(T, dtype=torch.int64, device=q.device)
    bad = torch.zeros(1, dtype=torch.int32, device=q.device) if check else None   # no memset launch otherwise
    _C.paged_attention_cuda(qc.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), DTYPE_CODES[k_pool.dtype],
                            out.data_ptr(), block_table.data_ptr(), token_seq.data_ptr(), key_begin.data_ptr(),
                            key_end.data_ptr(), 0 if tree_begin is None else tree_begin.data_ptr(),
                            0 if tree_mask is None else tree_mask.data_ptr(), partial.data_ptr(),
                            splits_used.data_ptr(), 0 if bad is None else bad.data_ptr(), block_table.shape[0],
                            block_table.shape[1],
                            page_size, k_pool.shape[0] // page_size, T, H, k_pool.shape[1], D, splits, float(scale),
                            stream_handle(q.device))
    if check and int(bad.item()):
        _bad_tokens(int(bad.item()), block_table)
    return out.to(q.dtype)
