"""Prompt lookup over a sequence's context, kept as an incremental n-gram index.

Scanning the context backwards every step costs more as the context grows;
``ContextIndex`` finds the same draft in constant time per step: it maps every n-gram of
the sequence (``min_ngram`` .. ``max_ngram`` tokens) to the start of its latest occurrence,
adding the n-grams of the tokens that arrived since the last call. The draft for a context
is what followed the latest earlier occurrence of its longest suffix n-gram - exactly the
backward scan's answer (tests compare them).

``LookupDrafts`` holds one index per sequence: what the n-gram proposer drafts from, and
what a model drafter (``ChainDrafter.lookup_tokens``) consults first, drafting from the
context where it repeats itself (code being edited, quoted text, lists) and with its model
elsewhere.
"""
from __future__ import annotations

from typing import Dict, List, Sequence


class ContextIndex:
    """n-grams of one growing token sequence -> start of their latest occurrence."""

    def __init__(self, max_ngram: int, min_ngram: int):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"n-gram lengths need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.starts: Dict[tuple, int] = {}
        self.indexed = 0   # n-grams ending before position ``indexed`` are in ``starts``

    def _extend(self, ids: Sequence[int], end: int) -> None:
        """Adds the n-grams that end at positions indexed .. end - 1."""
        for e in range(self.indexed, end):
            for n in range(self.min_ngram, min(self.max_ngram, e + 1) + 1):
                self.starts[tuple(ids[e + 1 - n:e + 1])] = e + 1 - n
        self.indexed = max(self.indexed, end)

    def draft(self, ids: Sequence[int], k: int) -> List[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest
        suffix n-gram of ``ids`` (``ids`` only ever grows between calls); [] if none."""
        n_ids = len(ids)
        if k < 1 or n_ids < 2:
            return []
        self._extend(ids, n_ids - 1)   # every n-gram but those ending at the last token
        for n in range(min(self.max_ngram, n_ids - 1), self.min_ngram - 1, -1):
            start = self.starts.get(tuple(ids[n_ids - n:]))
            if start is not None:
                return list(ids[start + n:start + n + k])
        return []


class LookupDrafts:
    """A ``ContextIndex`` per sequence (by ``seq_id``), made on first use."""

    def __init__(self, max_ngram: int, min_ngram: int):
        ContextIndex(max_ngram, min_ngram)   # validates the lengths
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.indexes: Dict[int, ContextIndex] = {}

    def draft(self, seq, k: int) -> List[int]:
        index = self.indexes.get(seq.seq_id)
        if index is None:
            index = self.indexes[seq.seq_id] = ContextIndex(self.max_ngram, self.min_ngram)
        return index.draft(seq.all_ids, k)

    def reset(self, seq) -> None:
        self.indexes.pop(seq.seq_id, None)
