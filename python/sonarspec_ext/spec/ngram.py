"""Prompt-lookup (n-gram) drafting: no draft model, the context proposes itself."""
from __future__ import annotations

from typing import List, Sequence

from .lookup import LookupDrafts
from .proposer import Draft, Proposer


def lookup(ids: List[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> List[int]:
    """Finds the most recent earlier occurrence of the longest suffix n-gram of ``ids``
    (max_ngram down to min_ngram tokens) and returns up to ``k`` tokens that followed it.
    The plain scan, which ``lookup.ContextIndex`` answers incrementally (the tests' oracle)."""
    n_ids = len(ids)
    for n in range(min(max_ngram, n_ids - 1), min_ngram - 1, -1):
        suffix = ids[n_ids - n:]
        for start in range(n_ids - n - 1, -1, -1):
            if ids[start:start + n] == suffix:
                return ids[start + n:start + n + k]
    return []


class NgramProposer(Proposer):
    def __init__(self, num_draft_tokens: int, max_ngram: int = 3, min_ngram: int = 1):
        self.max_draft_tokens = self.lookahead = num_draft_tokens
        self.lookups = LookupDrafts(max_ngram, min_ngram)

    def propose(self, seqs: Sequence, ks: Sequence[int]) -> List[Draft]:
        return [Draft(self.lookups.draft(s, k) if k else []) for s, k in zip(seqs, ks)]

    def reset(self, seq) -> None:
        self.lookups.reset(seq)
