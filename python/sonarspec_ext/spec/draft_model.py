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

from typing import Dict, List, Sequence, Tuple

import torch

from ..runtime.kv_cache import KVCache
from ..runtime.runner import ModelRunner
from .proposer import Draft, Proposer, RefillRow, StepRecord, flush_waiting, propose_chains, waiting_rows, whole_chains


class DraftModelProposer(Proposer):
    def __init__(self, model, num_draft_tokens: int, planner, num_pages: int, page_size: int,
                 target_vocab_size: int, dtype, device, sample_drafts: bool = False):
        """``model``: the draft (``models.draft_llm.load_draft_model``)."""
        self.model = model
        self.kv_cache = KVCache(self.model.config, num_pages, page_size, dtype, device)
        self.runner = ModelRunner(self.model, self.kv_cache)
        self.planner = planner
        self.vocab_size = target_vocab_size
        self.max_draft_tokens = num_draft_tokens
        self.lookahead = num_draft_tokens + 1   # the refill may write one slot past the chain
        self.sample_drafts = sample_drafts       # False: take the top token (point-mass drafts)
        self.device_chain = True   # greedy chains stay on the device where the native chain does not apply
        self.state: Dict[int, Tuple[int, torch.Tensor]] = {}  # seq_id -> (num_computed, logits)
        self.waiting: Dict[int, RefillRow] = {}  # seq_id -> a refill waiting
        self.defer_refills = not sample_drafts and self.runner.device.type == "cpu"

    def ready(self, seq) -> bool:
        p = self.waiting.get(seq.seq_id)
        if p is not None:
            return p.end == seq.num_tokens
        st = self.state.get(seq.seq_id)
        return st is not None and st[0] == seq.num_tokens

    def reset(self, seq) -> None:
        self.state.pop(seq.seq_id, None)
        self.waiting.pop(seq.seq_id, None)

    def _vocab_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits cut or padded (with -inf) to the target's vocabulary."""
        V = self.vocab_size
        if logits.shape[-1] >= V:
            return logits[:, :V]
        pad = torch.full((logits.shape[0], V - logits.shape[-1]), float("-inf"), device=logits.device)
        return torch.cat([logits, pad], dim=-1)

    def _refill(self, rows: List[RefillRow]) -> None:
        """Runs the draft over the rows and carries their logits."""
        out = self._run(rows)
        for r, row in enumerate(rows):
            self.state[row.seq.seq_id] = (row.end, out[r])

    def _refill_chains(self, seqs: Sequence, ks: Sequence[int]):
        """Drafts from one native call running every sequence's waiting refill and then its
        chain, when all of them have one and take the same k; else None."""
        found = waiting_rows(self.waiting, seqs, ks)
        if found is None:
            return None
        k, rows = found
        out = self.runner.refill_chain([(row.start, row.tokens, self.page_table(row.seq)) for row in rows],
                                       self.model.config.sliding_window, self.vocab_size, k - 1)
        if out is None:
            return None
        logits, _, tokens = out
        logits = self._vocab_logits(logits)
        for r, row in enumerate(rows):
            del self.waiting[row.seq.seq_id]
            self.state[row.seq.seq_id] = (row.end, logits[r])
        return [Draft(t) for t in tokens.tolist()]

    def _run(self, rows: List[RefillRow]) -> torch.Tensor:
        """One draft forward over the rows; logits at each row's last token, cut or padded to
        the target's vocabulary."""
        return self._vocab_logits(self.runner.forward_rows([(row.start, row.tokens, self.page_table(row.seq))
                                                            for row in rows], self.model.config.sliding_window))

    def propose(self, seqs: Sequence, ks: Sequence[int]) -> List[Draft]:
        drafts = self._refill_chains(seqs, ks)
        if drafts is not None:
            return drafts
        flush_waiting(self.waiting, self._refill)
        logits = [self.state[s.seq_id][1] for s in seqs]
        drafts = whole_chains(self, seqs, ks, logits, [s.num_tokens for s in seqs], self.model.config.sliding_window)
        if drafts is not None:
            return drafts

        def advance(j, rows, drafts):
            return list(self._run([RefillRow(seqs[i], seqs[i].num_tokens + j, [drafts[i].token_ids[j]])
                                   for i in rows]))
        return propose_chains(seqs, ks, logits, self.sample_drafts, advance)

    def after_step(self, records: Sequence[StepRecord]) -> None:
        flush_waiting(self.waiting, self._refill)
        rows = []
        for r in records:
            if not r.at_end or (self.step.paused and r.decoded):
                continue   # prefill chunks: prefilled at the last one; paused decodes: caught up later
            seq, st = r.seq, self.state.get(r.seq.seq_id)
            # Draft KV is valid for the tokens it has seen plus the accepted drafts it wrote
            # (all but the last); a draft that fell behind (paused steps) restarts where it stopped.
            valid = 0 if st is None else min(st[0], r.n_before)
            if st is not None and st[0] == r.n_before and r.draft is not None:
                valid += min(r.num_accepted, max(0, len(r.draft.token_ids) - 1))
            rows.append(RefillRow(seq, valid, seq.all_ids[valid:]))
        if self.defer_refills:
            self.waiting.update((row.seq.seq_id, row) for row in rows)
        elif rows:
            self._refill(rows)
