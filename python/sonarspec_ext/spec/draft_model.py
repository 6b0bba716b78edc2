"""Draft-target speculation: a small LLM drafts inside the engine, sharing the page table.

Per sequence the draft keeps its KV for every known token and carries the logits that
predict the next one. A step samples draft token 1 from the carried logits, runs the
draft k-1 more times, and after verification re-runs the draft over the newly emitted
token(s) (its refill), whose logits are carried into the next step. With top-token drafts
on the CPU the refill waits for the next step's drafting and runs with its chain as one
native call (``ModelRunner.refill_chain``); a step that drafts otherwise, or not at all,
runs the waiting refills first - the same computations either way.
"""
from __future__ import annotations

from typing import Sequence

from ..runtime.kv_cache import KVCache
from ..runtime.runner import ModelRunner
from .chain_drafter import ChainDrafter
from .proposer import RefillRow, StepRecord, flush_waiting


class DraftModelProposer(ChainDrafter):
    def __init__(self, model, num_draft_tokens: int, planner, num_pages: int, page_size: int,
                 target_vocab_size: int, dtype, device, sample_drafts: bool = False, stop_below: float = 0.0,
                 lookup_tokens: int = 0):
        """``model``: the draft (``models.draft_llm.load_draft_model``); ``lookup_tokens``:
        lookup drafts of up to that many tokens (``ChainDrafter``)."""
        self.model = model
        self.kv_cache = KVCache(model.config, num_pages, page_size, dtype, device)
        # the refill may write one slot past the chain: lookahead k + 1
        super().__init__(ModelRunner(model, self.kv_cache), planner, num_draft_tokens, num_draft_tokens + 1,
                         target_vocab_size, model.config.sliding_window, sample_drafts, stop_below, lookup_tokens)
        # state: seq_id -> (tokens the draft has computed, the logits predicting the next one)

    def ready(self, seq) -> bool:
        p = self.waiting.get(seq.seq_id)
        if p is not None:
            return p.end == seq.num_tokens
        st = self.state.get(seq.seq_id)
        return st is not None and st[0] == seq.num_tokens

    def kv_valid(self, seq) -> int:
        st = self.state.get(seq.seq_id)
        return 0 if st is None else st[0]

    def adopt_prefix(self, seq, num_tokens: int) -> None:
        self.state[seq.seq_id] = (num_tokens, None)

    def _carry(self, row: RefillRow, logits, output) -> None:
        self.state[row.seq.seq_id] = (row.end, logits)

    def _chain_start(self, seqs: Sequence):
        return [self.state[s.seq_id][1] for s in seqs], [s.num_tokens for s in seqs], None

    def after_step(self, records: Sequence[StepRecord]) -> None:
        flush_waiting(self.waiting, self.refill)
        rows = []
        for r in records:
            if not r.at_end or (self.step.paused and r.decoded):
                continue   # prefill chunks: prefilled at the last one; paused decodes: caught up later
            seq, st = r.seq, self.state.get(r.seq.seq_id)
            # Draft KV is valid for the tokens it has seen plus the accepted drafts it wrote
            # (all but the last); a draft that fell behind (paused steps) restarts where it stopped.
            valid = 0 if st is None else min(st[0], r.n_before)
            if st is not None and st[0] == r.n_before and r.draft is not None and not r.draft.lookup:
                valid += min(r.num_accepted, max(0, len(r.draft.token_ids) - 1))
            rows.append(RefillRow(seq, valid, seq.all_ids[valid:]))
        self.queue_refills(rows)
