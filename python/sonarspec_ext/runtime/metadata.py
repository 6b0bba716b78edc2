"""Build per-step attention metadata from the planner's decisions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import _C
from ..layers.attention import PagedAttentionMetadata
from ..ops.limits import CUDA_ATTENTION_MAX_TOKENS
from .transfer import to_device

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
    slots). ``native_attention`` (float32 models on the CPU, CUDA models the CUDA kernel
    takes): per-query key ranges (and tree bit masks) for ``ops.paged_attention`` instead
    of a mask tensor.
    Built natively (``_C.build_metadata``); ``reference_planner.build_metadata_reference``
    is the pure-Python twin the tests compare it with.
    """
    native = _use_native(sum(s[1] for s in seqs), device, native_attention)
    m = _C.build_metadata(seqs, _tree_args(trees), page_size, sliding_window or 0, not native)
    return _to_metadata(m, page_size, device, native)


def planner_metadata(planner, seq_ids: Sequence[int], starts: Sequence[int], num_query: Sequence[int], device,
                     sliding_window: Optional[int] = None, trees: Optional[List[Optional[TreeBlock]]] = None,
                     native_attention: bool = False):
    """``build_metadata`` for sequences of ``planner`` (``_C.Planner``), whose page tables
    it reads without copying them through Python."""
    native = _use_native(int(sum(num_query)), device, native_attention)
    arr = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    m = planner.build_metadata(arr(seq_ids), arr(starts), arr(num_query), _tree_args(trees), sliding_window or 0,
                               not native)
    return _to_metadata(m, planner.page_size, device, native)


def _use_native(num_tokens: int, device, native_attention: bool) -> bool:
    """Where asked, CPU steps of any size take the native kernel's key lists (per query
    token: a token's attention does not depend on the rest of the step), and CUDA steps of
    up to ``CUDA_ATTENTION_MAX_TOKENS`` tokens the CUDA kernel's (prefill: SDPA)."""
    kind = torch.device(device).type
    return native_attention and (kind == "cpu" or (kind == "cuda" and num_tokens <= CUDA_ATTENTION_MAX_TOKENS))


def _tree_args(trees):
    if trees is None or all(tr is None for tr in trees):
        return None
    return [None if tr is None else (tr.begin, tr.bits, tr.positions) for tr in trees]


def _to_metadata(m: dict, page_size: int, device, native: bool):
    names = ["slot_mapping", "query_index", "block_table", "output_index", "positions"]
    if native:   # the native attention kernel's key ranges (and tree bits) instead of a mask
        names += ["token_seq", "key_begin", "key_end"] + (["tree_begin", "tree_mask"] if m["has_tree"] else [])
    mask = None if m["mask"] is None else m["mask"].view(np.bool_)
    arrays = dict(zip(names + ["mask"], to_device([m[k] for k in names] + [mask], device)))
    block_table, kv_slots = arrays["block_table"], None
    if not native:   # SDPA gathers each sequence's cached K/V through per-position slots
        pos = torch.arange(m["kv_max"], device=block_table.device)
        kv_slots = block_table[:, pos // page_size] * page_size + pos % page_size
    meta = PagedAttentionMetadata(slot_mapping=arrays["slot_mapping"], query_index=arrays["query_index"],
                                  block_table=block_table, page_size=page_size, kv_slots=kv_slots, mask=arrays["mask"],
                                  output_index=arrays["output_index"], uniform_queries=m["uniform_queries"],
                                  native=tuple(arrays[k] for k in names[5:]) if native else None)
    return meta, arrays["positions"]
