"""Prompt-lookup (n-gram) drafting: no draft model, the context proposes itself."""
from __future__ import annotations

from typing import List, Sequence

from .lookup import LookupDrafts
from .proposer import Draft, Proposer


class NgramProposer(Proposer):
    def __init__(self, num_draft_tokens: int, max_ngram: int = 3, min_ngram: int = 1):
        self.max_draft_tokens = self.lookahead = num_draft_tokens
        self.lookups = LookupDrafts(max_ngram, min_ngram)

    def propose(self, seqs: Sequence, ks: Sequence[int]) -> List[Draft]:
        return [Draft(self.lookups.draft(s, k) if k else []) for s, k in zip(seqs, ks)]

    def reset(self, seq) -> None:
        self.lookups.reset(seq)
