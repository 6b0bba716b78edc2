"""MTP chain speculation: a one-layer head drafts from the target's hidden states.

Head position i reads (h_i, t_{i+1}) and predicts t_{i+2}; its KV pool is one layer deep
and shares the target's page table. Per sequence the proposer carries the logits and the
predicted feature of the head's last accurate position. A step draws draft 1 from the
carried logits and runs the head k-1 more times on its own predicted features; after
verification the head is re-run over the target's now-valid positions with the target's
hidden states (accurate features), overwriting the chain's approximate KV entries and
producing the carried logits and feature for the next step. On the CPU that re-run waits
for the next step's drafting and runs with its chain as one native call
(``ModelRunner.refill_chain``: top tokens, or draws for sampled requests); a step that
drafts otherwise (chains of different lengths), or not at all, runs the waiting re-runs
first - the same computations either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from ..runtime.kv_cache import KVCache
from ..runtime.runner import ModelRunner
from ..models.mtp import MTPHead
from .chain_drafter import ChainDrafter
from .proposer import RefillRow, StepRecord, flush_waiting


@dataclass
class _HeadState:
    valid: int                              # head KV positions 0 .. valid-1 hold accurate entries
    logits: Optional[object] = None         # predicts token ``valid + 1`` (ChainDrafter.carried_logits)
    feature: Optional[torch.Tensor] = None  # predicted target feature at position ``valid``
    # target features of positions valid.. not yet run (paused steps): one block per step, joined
    # once speculation resumes (appending to one tensor would copy it every paused step)
    pending: Optional[List[torch.Tensor]] = None
    pending_rows: int = 0                   # their rows in all


class MTPProposer(ChainDrafter):
    needs_hidden = True

    def __init__(self, head: MTPHead, num_draft_tokens: int, planner, num_pages: int, page_size: int,
                 dtype, device, sample_drafts: bool = False, stop_below: float = 0.0, lookup_tokens: int = 0):
        """``lookup_tokens``: lookup drafts of up to that many tokens (``ChainDrafter``)."""
        self.head = head
        self.kv_cache = KVCache(head.config, num_pages, page_size, dtype, device)
        super().__init__(ModelRunner(head, self.kv_cache), planner, num_draft_tokens, num_draft_tokens,
                         head.vocab_size, head.config.sliding_window, sample_drafts, stop_below, lookup_tokens)
        self.single_token_schedule = num_draft_tokens == 1   # the engine may use the single-token schedule

    def ready(self, seq) -> bool:
        w = self.waiting.get(seq.seq_id)
        if w is not None:
            return w.at_end and w.end == seq.num_tokens - 1
        st = self.state.get(seq.seq_id)
        return st is not None and st.logits is not None and st.valid == seq.num_tokens - 1

    def _carry(self, row: RefillRow, logits, output) -> None:
        """An at_end row carries its logits and feature into the next step."""
        self.state[row.seq.seq_id] = _HeadState(row.end, logits, output) if row.at_end else _HeadState(row.end)

    def kv_valid(self, seq) -> int:
        st = self.state.get(seq.seq_id)
        return 0 if st is None else st.valid

    def adopt_prefix(self, seq, num_tokens: int) -> None:
        self.state[seq.seq_id] = _HeadState(num_tokens)

    def _features(self, rows: List[RefillRow]) -> torch.Tensor:
        # one row's are used as they are (rows of the step's fresh hidden states): no copy
        return rows[0].features if len(rows) == 1 else torch.cat([row.features for row in rows])

    def _chain_start(self, seqs: Sequence):
        # head position N-1+j reads its own predicted feature and draft token j+1
        states = [self.state[s.seq_id] for s in seqs]
        return [st.logits for st in states], [s.num_tokens - 1 for s in seqs], [st.feature for st in states]

    def carry(self, seq, valid: int, logits: torch.Tensor, feature: torch.Tensor) -> None:
        """Head KV is accurate for positions < ``valid``; ``logits``/``feature`` come from the
        head at position valid - 1 (set by the single-token schedule)."""
        self.state[seq.seq_id] = _HeadState(valid, logits, feature)

    def after_step(self, records: Sequence[StepRecord]) -> None:
        flush_waiting(self.waiting, self.refill)
        rows = []
        for r in records:
            seq, st = r.seq, self.state.get(r.seq.seq_id)
            valid = 0 if st is None else st.valid
            held = st.pending if st is not None and st.pending else []   # features held back by paused steps
            start = valid if held else r.start
            gap = valid + st.pending_rows != r.start if held else r.start > valid
            if gap or r.hidden is None or not len(r.hidden):
                self.state.pop(seq.seq_id, None)   # a gap in the head's KV: stop drafting for it
                continue
            if self.step.paused:   # decoded or prefilled under load: run them once speculation resumes
                if held:
                    held.append(r.hidden)
                    st.pending_rows += len(r.hidden)
                else:
                    self.state[seq.seq_id] = _HeadState(valid, pending=[r.hidden], pending_rows=len(r.hidden))
                continue
            hidden = torch.cat(held + [r.hidden]) if held else r.hidden
            m = hidden.shape[0]
            rows.append(RefillRow(seq, start, seq.all_ids[start + 1:start + 1 + m], hidden, r.at_end))
        self.queue_refills(rows)
