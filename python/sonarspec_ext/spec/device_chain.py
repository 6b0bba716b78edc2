"""Greedy draft chains that stay on the device.

For a drafter running torch's kernels (CUDA, or the CPU where the native chain does not
apply), drafting k tokens one forward at a time would build attention metadata, copy it
to the device and read the top token back to the host k - 1 times. Here the metadata of
the whole chain (positions start .. start + k - 2 of every sequence, causal) is built and
copied once; round j runs the drafter on row j of it, whose mask hides the chain
positions not written yet, and feeds the round's top tokens (taken on the device) to the
next round. The host reads the k tokens of every sequence once, at the end.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ..runtime.metadata import build_metadata
from ..layers.attention import PagedAttentionMetadata


def chain_length(proposer, seqs, ks: Sequence[int]) -> int:
    """The k of a device chain for this proposal, or 0 where it does not apply: it needs one
    k >= 2 for every sequence and top-token drafts (greedy drafting, or greedy requests)."""
    k = ks[0] if ks else 0
    if (not proposer.device_chain or k < 2 or any(x != k for x in ks)
            or (proposer.sample_drafts and not all(s.params.greedy for s in seqs))):
        return 0
    return k


def device_chains(runner, logits: Sequence[torch.Tensor], k: int, positions: Sequence[int],
                  tables: Sequence[Sequence[int]], window: Optional[int], width: int,
                  features: Optional[torch.Tensor] = None) -> List[List[int]]:
    """Greedy chains of ``k`` >= 2 tokens: token 1 is the top token of ``logits[i]`` (the
    drafter's carried logits), tokens 2..k come from running ``runner``'s model from
    ``positions[i]`` on page table ``tables[i]``; only the first ``width`` logits (the
    target's vocabulary) compete. An MTP head also reads ``features`` (B, hidden): its
    predicted feature at the first position, then its own output of each round. Equal to
    drafting one forward at a time."""
    B, rounds = len(logits), k - 1
    meta, pos = build_metadata([(p, rounds, t) for p, t in zip(positions, tables)], runner.kv_cache.page_size,
                               runner.device, window, native_attention=runner.native_attention)
    if not meta.uniform_queries:   # the chain block is uniform by construction
        raise AssertionError("device_chains needs a uniform chain block")
    rows = torch.arange(B, device=runner.device)
    round_major = lambda t: t.view(B, rounds).t().contiguous()  # noqa: E731
    slots, pos = round_major(meta.slot_mapping), round_major(pos)
    key_lists = None if meta.native is None else [round_major(t) for t in meta.native]   # (seq, begin, end) rows
    tokens = [torch.stack(list(logits))[:, :width].argmax(-1)]
    for j in range(rounds):
        step = PagedAttentionMetadata(slot_mapping=slots[j], query_index=rows[:, None], block_table=meta.block_table,
                                      page_size=meta.page_size, kv_slots=meta.kv_slots,
                                      mask=None if meta.mask is None else meta.mask[:, :, j:j + 1],
                                      output_index=rows, uniform_queries=True,
                                      native=None if key_lists is None else tuple(t[j] for t in key_lists))
        if features is None:
            out = runner.forward(tokens[-1], pos[j], step, rows)
        else:
            out, features = runner.forward(tokens[-1], pos[j], step, rows, hidden_indices=rows, features=features)
        tokens.append(out[:, :width].argmax(-1))
    return torch.stack(tokens, 1).tolist()
