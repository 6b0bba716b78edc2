"""The single-token MTP schedule, without a host sync between verification and the head re-run.

Every sequence of the batch decodes with one draft, so the target verifies 2 x D
tokens. Acceptance and the next token are decided on the device, ``ops.shifted_scatter``
builds the head's input tokens from the target's, and the head re-runs over both
positions of every sequence with the target's own batch metadata (on a rejected draft
the second position is wasted work, overwritten next step). Only then does the host
read the accepted counts; on a GPU that read overlaps the head's run.
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from typing import List

import torch
from torch.overrides import TorchFunctionMode

from ..ops import shifted_scatter
from .blocks import pack
from ..spec.verify import verify_chain_device

_SYNCING = {"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "__array__"}


class HostSyncError(RuntimeError):
    """A tensor was read by the host inside a region that must not wait for the device."""


class forbid_host_syncs(TorchFunctionMode):
    """Raises ``HostSyncError`` on any tensor read by the host (item, tolist, bool(), int(),
    indexing with a tensor scalar, numpy, cpu) - works on every device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _SYNCING:
            raise HostSyncError(f"host synchronisation ({name}) inside a sync-free region")
        return func(*args, **(kwargs or {}))


def host_sync_guard(device):
    """The guard ``EngineConfig.check_host_syncs`` puts around the region on ``device``."""
    return cuda_sync_guard() if torch.device(device).type == "cuda" else forbid_host_syncs()


@contextmanager
def cuda_sync_guard():
    """``torch.cuda.set_sync_debug_mode('error')`` for the region (CUDA devices)."""
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(old)


def single_token_step(engine, batch, drafts) -> List:
    proposer = engine.proposer
    t0 = time.perf_counter()
    ids, positions, meta, blocks, logits_idx = pack(engine, batch, drafts)
    logits, hidden = engine.runner.forward(ids, positions, meta, logits_idx, hidden_indices=slice(None))
    starts = torch.tensor([b.row for b in blocks], dtype=torch.long, device=ids.device)
    t1 = time.perf_counter()
    with host_sync_guard(engine.device) if engine.config.check_host_syncs else nullcontext():
        tokens, accepted = [], []
        for b in blocks:
            t, a = verify_chain_device(logits[b.logits_offset:b.logits_offset + 2], ids[b.row + 1:b.row + 2],
                                       b.draft.probs, b.seq.params, b.seq)
            tokens.append(t)
            accepted.append(a)
        tokens, accepted = torch.stack(tokens), torch.stack(accepted)
        next_tokens = tokens.gather(1, accepted[:, None])[:, 0]
        t2 = time.perf_counter()
        head_ids = shifted_scatter(ids, starts, torch.full_like(starts, 2), next_tokens, accepted)
        carried = starts + accepted   # the head row at each sequence's last accurate position
        head_logits, head_feats = proposer.runner.forward(head_ids, positions, meta, carried,
                                                          hidden_indices=carried, features=hidden)
    t3 = time.perf_counter()
    accepted_host, tokens_host = accepted.tolist(), tokens.tolist()   # the host learns the lengths here
    for i, b in enumerate(blocks):
        a = accepted_host[i]
        lp_rows = logits[b.logits_offset:b.logits_offset + a + 1] if b.seq.logprobs is not None else None
        n_before = engine.emit(b.seq, tokens_host[i][:a + 1], a, b.draft, lp_rows)
        if not b.seq.finished:
            proposer.carry(b.seq, n_before + a, head_logits[i], head_feats[i])
    t4 = time.perf_counter()
    engine.timing["verify"] += t1 - t0
    engine.timing["sample"] += t2 - t1
    engine.timing["draft"] += t3 - t2
    engine.timing["post"] += t4 - t3
    return [b.seq for b in blocks]
