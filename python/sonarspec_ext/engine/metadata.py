"""Build per-step attention metadata from the planner's decisions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..layers.attention import PagedAttentionMetadata

# Steps with at most this many query tokens may use the native CPU attention kernel;
# longer prefills go to torch's SDPA.
NATIVE_ATTENTION_MAX_TOKENS = 64
TREE_MAX_NODES = 64   # a tree block is addressed by one 64-bit ancestor mask per query


@dataclass
class TreeBlock:
    """Draft-tree queries of one sequence: they see the committed prefix [0, begin) and,
    of the tree block that starts at position ``begin``, the positions begin + j for each
    bit j of their ``bits`` entry (ancestors and themselves). ``positions`` are their RoPE
    positions (nodes at one depth share one)."""
    begin: int
    bits: np.ndarray        # (num_query,) int64 bit masks over the tree block
    positions: np.ndarray   # (num_query,) int64


def tree_bits(mask: np.ndarray) -> np.ndarray:
    """(n, m) bool ancestor mask (m <= 64 tree keys) -> (n,) int64 bit masks."""
    if mask.shape[1] > TREE_MAX_NODES:
        raise ValueError(f"a tree block holds at most {TREE_MAX_NODES} positions, got {mask.shape[1]}")
    weights = (np.uint64(1) << np.arange(mask.shape[1], dtype=np.uint64))
    return (mask.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64).view(np.int64)


def build_metadata(seqs: Sequence[Tuple[int, int, Sequence[int]]], page_size: int, device,
                   sliding_window: Optional[int] = None,
                   trees: Optional[List[Optional[TreeBlock]]] = None, native_attention: bool = False):
    """``seqs``: (start, num_query_tokens, page_table) per sequence, in packed order.

    Returns (metadata, positions) where positions is (num_tokens,) int64; queries sit at
    positions start .. start + num_query - 1 and attend causally, except for sequences
    whose ``trees`` entry is a ``TreeBlock`` (draft-tree queries, written to the same
    slots). ``native_attention`` (float32 models on the CPU): small steps get per-query
    key ranges (and tree bit masks) for ``ops.paged_attention`` instead of a mask tensor.
    """
    B = len(seqs)
    q_lens = np.fromiter((s[1] for s in seqs), dtype=np.int64, count=B)
    kv_lens = np.fromiter((s[0] + s[1] for s in seqs), dtype=np.int64, count=B)
    q_max, kv_max = int(q_lens.max()), int(kv_lens.max())
    kv_slots = np.zeros((B, kv_max), dtype=np.int64)
    query_index = np.zeros((B, q_max), dtype=np.int64)
    positions = np.empty(int(q_lens.sum()), dtype=np.int64)
    slot_mapping = np.empty_like(positions)
    output_index = np.empty_like(positions)
    token_seq = np.empty_like(positions)
    key_end = np.empty_like(positions)
    tree_begin = np.zeros_like(positions)
    tree_mask = np.zeros_like(positions)
    offset = 0
    for b, (start, n, table) in enumerate(seqs):
        kv_len = start + n
        pos = np.arange(kv_len, dtype=np.int64)
        pages = np.asarray(table, dtype=np.int64)
        slots = pages[pos // page_size] * page_size + pos % page_size
        kv_slots[b, :kv_len] = slots
        tree = None if trees is None else trees[b]
        slot_mapping[offset:offset + n] = slots[start:]
        query_index[b, :n] = np.arange(offset, offset + n)
        output_index[offset:offset + n] = b * q_max + np.arange(n)
        token_seq[offset:offset + n] = b
        if tree is None:
            positions[offset:offset + n] = pos[start:]
            key_end[offset:offset + n] = pos[start:] + 1
        else:
            if kv_len - tree.begin > TREE_MAX_NODES:
                raise ValueError(f"a tree block holds at most {TREE_MAX_NODES} positions, got {kv_len - tree.begin}")
            positions[offset:offset + n] = tree.positions
            key_end[offset:offset + n] = tree.begin
            tree_begin[offset:offset + n] = tree.begin
            tree_mask[offset:offset + n] = tree.bits
        offset += n
    t = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    native = None
    has_tree = trees is not None and any(tr is not None for tr in trees)
    # sliding window: a query at position p sees prefix keys after p - window
    key_begin = (np.maximum(positions + 1 - sliding_window, 0) if sliding_window is not None
                 else np.zeros_like(key_end))
    if native_attention and len(positions) <= NATIVE_ATTENTION_MAX_TOKENS and torch.device(device).type == "cpu":
        native = (t(token_seq), t(key_begin), t(key_end)) + ((t(tree_begin), t(tree_mask)) if has_tree else ())
    uniform = bool((q_lens == 1).all() and (kv_lens == kv_max).all()) and sliding_window is None
    mask = None
    if native is None and (not uniform or has_tree):
        key = np.arange(kv_max)
        m = (key >= key_begin[:, None]) & (key < key_end[:, None])          # (num_tokens, kv_max)
        if has_tree:
            rel = key[None, :] - tree_begin[:, None]
            bit = (tree_mask.view(np.uint64)[:, None] >> np.clip(rel, 0, 63).astype(np.uint64)) & np.uint64(1)
            m |= (rel >= 0) & (rel < TREE_MAX_NODES) & (tree_mask != 0)[:, None] & bit.astype(bool)
        grid = np.zeros((B * q_max, kv_max), dtype=bool)
        grid[:, 0] = True  # padded query rows see one key so softmax stays finite
        grid[output_index] = m
        mask = torch.from_numpy(grid.reshape(B, 1, q_max, kv_max)).to(device)
    meta = PagedAttentionMetadata(slot_mapping=t(slot_mapping), query_index=t(query_index),
                                  kv_slots=t(kv_slots), mask=mask, output_index=t(output_index),
                                  uniform_queries=bool((q_lens == q_max).all()), native=native)
    return meta, t(positions)
