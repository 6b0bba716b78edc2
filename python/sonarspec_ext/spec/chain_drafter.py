"""``ChainDrafter``: what the draft-model and MTP proposers share - a drafter model on its
own runner and KV pool (sharing the target's page table) that drafts chains, and its
re-runs after each step (``RefillRow``), run at once or left waiting for the next step's
drafting.

Per sequence the drafter carries the logits that predict its next draft (and, for an MTP
head, a predicted feature). ``propose`` takes, in order: one native call running every
waiting re-run and then its chain (``ModelRunner.refill_chain``, greedy CPU drafting);
else the waiting re-runs, then all chains without a host round trip per round
(``fused_chains``: native chains, or greedy chains kept on the device); else the rounds
one by one (``propose_chains``) - the same computations whichever applies.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..models.llama import vocab_logits
from .draft_stop import truncate_rows
from .lookup import LookupDrafts
from .chains import chain_sampling, draft_penalties, fused_chains, propose_chains, vocab_probs
from .proposer import Draft, Proposer, RefillRow, flush_waiting, waiting_rows


LOOKUP_MAX_NGRAM, LOOKUP_MIN_NGRAM = 4, 3   # the context n-grams lookup drafts match (longest first)


class ChainDrafter(Proposer):
    def __init__(self, runner, planner, num_draft_tokens: int, lookahead: int, vocab_size: int,
                 window: Optional[int], sample_drafts: bool, stop_below: float = 0.0, lookup_tokens: int = 0):
        """``vocab_size``: the target's (the drafter's logits are cut or padded to it);
        ``window``: the drafter's sliding window (None: none); ``stop_below``: greedy chains
        stop where the draft's probability falls below it (``spec.draft_stop``; 0: never);
        ``lookup_tokens``: where a sequence's context holds an earlier occurrence of its last
        ``LOOKUP_MIN_NGRAM`` to ``LOOKUP_MAX_NGRAM`` tokens, the step drafts up to that many
        tokens that followed it instead of the drafter's chain (0: never)."""
        self.runner, self.planner = runner, planner
        self.max_draft_tokens, self.lookahead = num_draft_tokens, max(lookahead, lookup_tokens)
        self.lookup_tokens = lookup_tokens
        self.lookups = LookupDrafts(LOOKUP_MAX_NGRAM, LOOKUP_MIN_NGRAM) if lookup_tokens else None
        self.vocab_size, self.window = vocab_size, window
        # sampled requests' drafts drawn from their processed distribution q (greedy requests
        # always take the top token: point-mass drafts); False: every draft is the top token
        self.sample_drafts = sample_drafts
        self.stop_below = stop_below   # point-mass chains only
        self.device_chain = True   # greedy chains stay on the device where the native chain does not apply
        self.state: Dict[int, object] = {}       # seq_id -> what the drafter carries (the subclass's)
        self.waiting: Dict[int, RefillRow] = {}  # seq_id -> a re-run waiting for the next draft
        self.defer_refills = runner.device.type == "cpu"

    # ---- the subclass's part ----------------------------------------------------------
    def _carry(self, row: RefillRow, logits: torch.Tensor, output: Optional[torch.Tensor]) -> None:
        """Stores what a re-run of ``row`` leaves for the sequence's next draft."""
        raise NotImplementedError

    def _chain_start(self, seqs: Sequence) -> Tuple[List[torch.Tensor], List[int], Optional[List[torch.Tensor]]]:
        """Per sequence: the carried logits, the position of the chain's first round, and
        (MTP heads) the carried feature; None for drafters without features."""
        raise NotImplementedError

    def _features(self, rows: List[RefillRow]) -> Optional[torch.Tensor]:
        """The rows' feature inputs (MTP heads: the target's hidden states), else None."""
        return None

    # ---- shared -------------------------------------------------------------------------
    def reset(self, seq) -> None:
        self.state.pop(seq.seq_id, None)
        self.waiting.pop(seq.seq_id, None)
        if self.lookups is not None:
            self.lookups.reset(seq)

    def backlog(self, seq) -> int:
        row = self.waiting.get(seq.seq_id)
        return 0 if row is None else len(row.tokens)

    def to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """The drafter's logits cut or padded (with -inf) to the target's vocabulary."""
        V = self.vocab_size
        if logits.shape[-1] >= V:
            return logits[:, :V]
        pad = torch.full((logits.shape[0], V - logits.shape[-1]), float("-inf"), device=logits.device)
        return torch.cat([logits, pad], dim=-1)

    def carried_logits(self, logits) -> torch.Tensor:
        """Carried logits over the target's vocabulary. A refill run with its chain leaves
        them over the lm_head rows it used, (row, row ids): widened only when a chain reads
        them - the next step's refill + chain, the usual case, recomputes them instead."""
        if isinstance(logits, torch.Tensor):
            return logits
        row, row_ids = logits
        return self.to_target_vocab(vocab_logits(row.unsqueeze(0), row_ids, self.runner.model.vocab_size))[0]

    def run(self, rows: List[RefillRow]):
        """One drafter forward over the rows -> (logits cut to the target's vocabulary,
        outputs or None) at each row's last token."""
        tables = [(row.start, row.tokens, self.page_table(row.seq)) for row in rows]
        features = self._features(rows)
        if features is None:
            return self.to_target_vocab(self.runner.forward_rows(tables, self.window)), None
        logits, outs = self.runner.forward_rows(tables, self.window, features=features)
        return self.to_target_vocab(logits), outs

    def refill(self, rows: List[RefillRow]) -> None:
        """Runs the drafter over the rows now and carries its results."""
        logits, outs = self.run(rows)
        for i, row in enumerate(rows):
            self._carry(row, logits[i], None if outs is None else outs[i])

    def queue_refills(self, rows: List[RefillRow]) -> None:
        """The step's re-runs: left waiting for the next drafting (greedy CPU drafting), else run."""
        if self.defer_refills:
            self.waiting.update((row.seq.seq_id, row) for row in rows)
        elif rows:
            self.refill(rows)

    def _refill_chains(self, seqs: Sequence, ks: Sequence[int]) -> Optional[List[Draft]]:
        """Drafts from one native call running every sequence's waiting re-run and then its
        chain, when all of them have one and take the same k; else None. Sampled requests
        draw their drafts there (with draft sampling), greedy ones take top tokens, chains
        of top tokens only stopping below ``stop_below``."""
        found = waiting_rows(self.waiting, seqs, ks)
        if found is None:
            return None
        k, rows = found
        sampled = self.sample_drafts and not all(s.params.greedy for s in seqs)
        out = self.runner.refill_chain([(row.start, row.tokens, self.page_table(row.seq)) for row in rows],
                                       self.window, self.vocab_size, k - 1, features=self._features(rows),
                                       stop_below=None if sampled else self.stop_below or None,
                                       sampling=(lambda: chain_sampling(seqs, k, 0)) if sampled else None,
                                       penalties=lambda row_ids, rows: draft_penalties(seqs, row_ids, rows))
        if out is None:
            return None
        logits, outs, tokens, scores, probs = out   # logits over the lm_head rows row_ids
        row_ids = self.runner.model.drafting_io()[2]
        for i, row in enumerate(rows):
            del self.waiting[row.seq.seq_id]
            self._carry(row, (logits[i], row_ids), outs[i])
        if sampled:   # greedy requests: point masses
            probs = vocab_probs(probs, row_ids, self.vocab_size)
            return [Draft(t, None if s.params.greedy else probs[i])
                    for i, (s, t) in enumerate(zip(seqs, tokens.tolist()))]
        chains = tokens.tolist() if scores is None else truncate_rows(tokens, scores, self.stop_below)
        return [Draft(t) for t in chains]

    def propose(self, seqs: Sequence, ks: Sequence[int]) -> List[Draft]:
        """Lookup drafts where the context repeats itself (``lookup_tokens``), the drafter's
        chains for the other sequences."""
        found = self._lookup_drafts(seqs, ks)
        if found is None:
            return self._chains(seqs, ks)
        rest = [i for i, d in enumerate(found) if d is None]
        for i, d in zip(rest, self._chains([seqs[i] for i in rest], [ks[i] for i in rest]) if rest else []):
            found[i] = d
        return found

    def _lookup_drafts(self, seqs: Sequence, ks: Sequence[int]) -> Optional[List[Optional[Draft]]]:
        """Per sequence a lookup draft (``Draft.lookup``) or None; None where no sequence has one.
        A lookup draft may be longer than the sequence's k (the chain length the step asked
        for), up to ``lookup_tokens`` and the room left in the context and ``max_tokens``."""
        if self.lookups is None:
            return None
        found: List[Optional[Draft]] = [None] * len(seqs)
        for i, (s, k) in enumerate(zip(seqs, ks)):
            room = min(self.lookup_tokens, s.draft_room(self.planner.max_model_len))
            tokens = self.lookups.draft(s, room) if k > 0 else []
            if tokens:
                found[i] = Draft(tokens, lookup=True)
        return found if any(d is not None for d in found) else None

    def _chains(self, seqs: Sequence, ks: Sequence[int]) -> List[Draft]:
        """The drafter's chains of ks[i] tokens."""
        drafts = self._refill_chains(seqs, ks)
        if drafts is not None:
            return drafts
        flush_waiting(self.waiting, self.refill)
        logits, positions, feats = self._chain_start(seqs)
        logits = [self.carried_logits(row) for row in logits]
        stacked = torch.stack(feats) if feats is not None and seqs else None
        drafts = fused_chains(self, seqs, ks, logits, positions, self.window, stacked, self.stop_below)
        if drafts is not None:
            return drafts

        def advance(j, rows, drafts):
            # round j + 1 reads draft token j + 1 (an MTP head: and its own predicted feature)
            out_logits, out_feats = self.run(
                [RefillRow(seqs[i], positions[i] + j, [drafts[i].token_ids[j]],
                           None if feats is None else feats[i].unsqueeze(0)) for i in rows])
            if feats is not None:
                for r, i in enumerate(rows):
                    feats[i] = out_feats[r]
            return list(out_logits)
        return propose_chains(seqs, ks, logits, self.sample_drafts, advance, self.stop_below)
