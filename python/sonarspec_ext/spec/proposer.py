"""Draft proposers: what fills the lookahead slots of a decode step.

A proposer is asked for up to ``k`` draft tokens per decoding sequence; the engine's
target pass verifies them. ``NoProposer`` is plain decoding (k = 0 for everyone).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch


@dataclass
class Draft:
    """Draft tokens for one sequence and the distributions they were drawn from.

    ``probs`` is (len(token_ids), vocab_size), or None for point-mass drafts (greedy or
    lookup drafting), which verification treats as one-hot rows."""
    token_ids: List[int]
    probs: Optional[torch.Tensor] = None


class Proposer:
    #: extra KV slots each decoding sequence needs beyond its next token
    lookahead: int = 0
    max_draft_tokens: int = 0

    def ready(self, seq) -> bool:
        """Whether ``seq`` can be drafted for in this step."""
        return True

    def propose(self, seqs: Sequence, ks: Sequence[int]) -> List[Draft]:
        return [Draft([]) for _ in seqs]

    def after_step(self, emitted: Sequence) -> None:
        """Called with (seq, num_tokens_before_step, num_drafts_written, num_accepted) for
        every live sequence that received tokens this step."""

    def reset(self, seq) -> None:
        """``seq`` lost its KV (preempted) or finished."""


class NoProposer(Proposer):
    pass
