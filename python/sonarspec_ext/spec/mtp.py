"""MTP chain speculation: a one-layer head drafts from the target's hidden states.

Head position i reads (h_i, t_{i+1}) and predicts t_{i+2}; its KV pool is one layer deep
and shares the target's page table. Per sequence the proposer carries the logits and the
predicted feature of the head's last accurate position. A step draws draft 1 from the
carried logits and runs the head k-1 more times on its own predicted features; after
verification the head is re-run over the target's now-valid positions with the target's
hidden states (accurate features), overwriting the chain's approximate KV entries and
producing the carried logits and feature for the next step. With top-token drafts on the
CPU that re-run waits for the next step's drafting and runs with its chain as one native
call (``ModelRunner.refill_chain``); a step that drafts otherwise, or not at all, runs the
waiting re-runs first - the same computations either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import torch

from ..runtime.kv_cache import KVCache
from ..runtime.runner import ModelRunner
from ..models.mtp import MTPHead
from .proposer import Draft, Proposer, RefillRow, StepRecord, flush_waiting, propose_chains, waiting_rows, whole_chains


@dataclass
class _HeadState:
    valid: int                              # head KV positions 0 .. valid-1 hold accurate entries
    logits: Optional[torch.Tensor] = None   # predicts token ``valid + 1``
    feature: Optional[torch.Tensor] = None  # predicted target feature at position ``valid``
    pending: Optional[torch.Tensor] = None  # target features of positions valid.. not yet run (paused steps)


class MTPProposer(Proposer):
    needs_hidden = True

    def __init__(self, head: MTPHead, num_draft_tokens: int, planner, num_pages: int, page_size: int,
                 dtype, device, sample_drafts: bool = False):
        self.head = head
        self.kv_cache = KVCache(head.config, num_pages, page_size, dtype, device)
        self.runner = ModelRunner(head, self.kv_cache)
        self.planner = planner
        self.vocab_size = head.vocab_size
        self.max_draft_tokens = self.lookahead = num_draft_tokens
        self.sync_free = num_draft_tokens == 1   # the engine may use the single-token schedule
        self.sample_drafts = sample_drafts
        self.device_chain = True   # greedy chains stay on the device where the native chain does not apply
        self.state: Dict[int, _HeadState] = {}
        self.waiting: Dict[int, RefillRow] = {}   # seq_id -> a head re-run waiting
        self.defer_refills = not sample_drafts and self.runner.device.type == "cpu"

    def ready(self, seq) -> bool:
        w = self.waiting.get(seq.seq_id)
        if w is not None:
            return w.at_end and w.end == seq.num_tokens - 1
        st = self.state.get(seq.seq_id)
        return st is not None and st.logits is not None and st.valid == seq.num_tokens - 1

    def reset(self, seq) -> None:
        self.state.pop(seq.seq_id, None)
        self.waiting.pop(seq.seq_id, None)

    def _refill(self, rows: List[RefillRow]) -> None:
        """Re-runs the head over the rows; an at_end row carries its logits and feature into
        the next step."""
        logits, feats = self.run_head(rows)
        for i, row in enumerate(rows):
            self.state[row.seq.seq_id] = _HeadState(row.end, logits[i], feats[i]) if row.at_end else _HeadState(row.end)

    def _refill_chains(self, seqs: Sequence, ks: Sequence[int]) -> Optional[List[Draft]]:
        """Drafts from one native call running every sequence's waiting re-run and then its
        chain, when all of them have one and take the same k; else None."""
        found = waiting_rows(self.waiting, seqs, ks)
        if found is None:
            return None
        k, rows = found
        out = self.runner.refill_chain([(row.start, row.tokens, self.page_table(row.seq)) for row in rows],
                                       self.head.config.sliding_window, self.vocab_size, k - 1,
                                       features=torch.cat([row.features for row in rows]))
        if out is None:
            return None
        logits, feats, tokens = out
        for i, row in enumerate(rows):
            del self.waiting[row.seq.seq_id]
            self.state[row.seq.seq_id] = _HeadState(row.end, logits[i], feats[i])
        return [Draft(t) for t in tokens.tolist()]

    def carry(self, seq, valid: int, logits: torch.Tensor, feature: torch.Tensor) -> None:
        """Head KV is accurate for positions < ``valid``; ``logits``/``feature`` come from the
        head at position valid - 1 (set by the single-token schedule)."""
        self.state[seq.seq_id] = _HeadState(valid, logits, feature)

    def run_head(self, rows: List[RefillRow]):
        """One head forward over rows (tokens t_{i+1} from position i, features h_i) ->
        (logits, features) at each row's last position."""
        return self.runner.forward_rows([(row.start, row.tokens, self.page_table(row.seq)) for row in rows],
                                        self.head.config.sliding_window,
                                        features=torch.cat([row.features for row in rows]))

    def propose(self, seqs: Sequence, ks: Sequence[int]) -> List[Draft]:
        drafts = self._refill_chains(seqs, ks)
        if drafts is not None:
            return drafts
        flush_waiting(self.waiting, self._refill)
        states = [self.state[s.seq_id] for s in seqs]
        feats = [st.feature for st in states]
        drafts = whole_chains(self, seqs, ks, [st.logits for st in states], [s.num_tokens - 1 for s in seqs],
                              self.head.config.sliding_window, torch.stack(feats) if seqs else None)
        if drafts is not None:
            return drafts

        def advance(j, rows, drafts):
            # head position N-1+j reads its own predicted feature and draft token j+1
            out_logits, out_feats = self.run_head(
                [RefillRow(seqs[i], seqs[i].num_tokens - 1 + j, [drafts[i].token_ids[j]], feats[i].unsqueeze(0))
                 for i in rows])
            for r, i in enumerate(rows):
                feats[i] = out_feats[r]
            return list(out_logits)
        return propose_chains(seqs, ks, [st.logits for st in states], self.sample_drafts, advance)

    def after_step(self, records: Sequence[StepRecord]) -> None:
        flush_waiting(self.waiting, self._refill)
        rows = []
        for r in records:
            seq, st = r.seq, self.state.get(r.seq.seq_id)
            valid = 0 if st is None else st.valid
            start, hidden = r.start, r.hidden
            if st is not None and st.pending is not None:   # features held back by paused steps
                start, hidden = valid, torch.cat([st.pending, r.hidden])
                gap = valid + len(st.pending) != r.start
            else:
                gap = r.start > valid
            if gap or r.hidden is None or not len(r.hidden):
                self.state.pop(seq.seq_id, None)   # a gap in the head's KV: stop drafting for it
                continue
            if self.step.paused and r.decoded and st is not None:
                self.state[seq.seq_id] = _HeadState(valid, pending=hidden)   # run it once speculation resumes
                continue
            m = hidden.shape[0]
            rows.append(RefillRow(seq, start, seq.all_ids[start + 1:start + 1 + m], hidden, r.at_end))
        if self.defer_refills:
            self.waiting.update((row.seq.seq_id, row) for row in rows)
        elif rows:
            self._refill(rows)
