"""Prompt-lookup (n-gram) drafting: no draft model, the context proposes itself."""
from __future__ import annotations

from typing import List, Sequence

from .proposer import Draft, Proposer


def lookup(ids: List[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> List[int]:
    """Finds the most recent earlier occurrence of the longest suffix n-gram of ``ids``
    (max_ngram down to min_ngram tokens) and returns up to ``k`` tokens that followed it."""
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
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, seqs: Sequence, ks: Sequence[int]) -> List[Draft]:
        return [Draft(lookup(s.all_ids, k, self.max_ngram, self.min_ngram) if k else []) for s, k in zip(seqs, ks)]
