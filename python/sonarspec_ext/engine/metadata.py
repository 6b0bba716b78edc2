"""Build per-step attention metadata from the planner's decisions."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..layers.attention import PagedAttentionMetadata

# Steps with at most this many query tokens (and no custom masks) may use the native
# CPU attention kernel; longer prefills go to torch's SDPA.
NATIVE_ATTENTION_MAX_TOKENS = 64


def build_metadata(seqs: Sequence[Tuple[int, int, Sequence[int]]], page_size: int, device,
                   sliding_window: Optional[int] = None,
                   query_masks: Optional[List[Optional[np.ndarray]]] = None,
                   query_positions: Optional[List[Optional[np.ndarray]]] = None,
                   native_attention: bool = False):
    """``seqs``: (start, num_query_tokens, page_table) per sequence, in packed order.

    Returns (metadata, positions) where positions is (num_tokens,) int64. ``query_masks``
    optionally gives, per sequence, a (num_query, num_query) bool mask over its own query
    block (True = may attend), replacing the causal rule inside that block, and
    ``query_positions`` the RoPE positions of its query tokens (tree nodes share depths);
    by default queries sit at positions start .. start + num_query - 1.
    ``native_attention`` (float32 models on the CPU): small steps without custom masks get
    per-query key ranges for ``ops.paged_attention`` instead of a mask tensor.
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
    offset = 0
    for b, (start, n, table) in enumerate(seqs):
        kv_len = start + n
        pos = np.arange(kv_len, dtype=np.int64)
        pages = np.asarray(table, dtype=np.int64)
        slots = pages[pos // page_size] * page_size + pos % page_size
        kv_slots[b, :kv_len] = slots
        own = None if query_positions is None else query_positions[b]
        positions[offset:offset + n] = pos[start:] if own is None else own
        slot_mapping[offset:offset + n] = slots[start:]
        query_index[b, :n] = np.arange(offset, offset + n)
        output_index[offset:offset + n] = b * q_max + np.arange(n)
        token_seq[offset:offset + n] = b
        key_end[offset:offset + n] = pos[start:] + 1
        offset += n
    t = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    native = None
    if (native_attention and query_masks is None and len(positions) <= NATIVE_ATTENTION_MAX_TOKENS
            and torch.device(device).type == "cpu"):
        key_begin = np.maximum(key_end - sliding_window, 0) if sliding_window is not None else np.zeros_like(key_end)
        native = (t(token_seq), t(key_begin), t(key_end))
    uniform = bool((q_lens == 1).all() and (kv_lens == kv_max).all()) and sliding_window is None
    mask = None
    if native is None and (not uniform or query_masks is not None):
        q_pos = np.zeros((B, q_max), dtype=np.int64)
        for b, (start, n, _) in enumerate(seqs):
            q_pos[b, :n] = np.arange(start, start + n)
        key = np.arange(kv_max)[None, None, :]
        m = key <= q_pos[:, :, None]
        if sliding_window is not None:
            m &= key > q_pos[:, :, None] - sliding_window
        for b, (start, n, _) in enumerate(seqs):
            if query_masks is not None and query_masks[b] is not None:
                m[b, :n, start:start + n] = query_masks[b]
            m[b, n:, 0] = True  # padded query rows see one key so softmax stays finite
        mask = torch.from_numpy(m).unsqueeze(1).to(device)
    meta = PagedAttentionMetadata(slot_mapping=t(slot_mapping), query_index=t(query_index),
                                  kv_slots=t(kv_slots), mask=mask, output_index=t(output_index),
                                  uniform_queries=bool((q_lens == q_max).all()), native=native)
    return meta, t(positions)
