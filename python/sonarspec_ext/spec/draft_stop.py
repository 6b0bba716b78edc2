"""Confidence-stopped chains (``SpecConfig.draft_stop_prob``): a greedy chain drafts while
the drafter's own probability of the whole draft - the product of its tokens' softmax
probabilities - stays at or above a threshold, up to ``num_draft_tokens``, and at least
one token. Verifying a draft token costs about the same whether or not it is accepted,
so a token the drafter itself doubts is mostly paid for and thrown away; where the
drafter is sure, the chain runs to its full length.

Any draft length leaves the output unchanged (verification decides every token), so this
changes speed only. The native chains score and stop in the same way
(``ops.stack_drafting``: ``scores``, ``stop_below``); the threshold compares the
drafter's own probabilities, so a row's draft does not depend on the other rows.
"""
from __future__ import annotations

from typing import List, Sequence

import torch


def token_probability(logits: torch.Tensor, token: int) -> float:
    """The softmax probability of ``token`` under (vocab,) logits (temperature 1)."""
    x = logits.float()
    m = x.max()
    if not torch.isfinite(m) or torch.isnan(x).any():
        return 0.0
    return float(torch.exp(x[token] - m) / torch.exp(x - m).sum())


def kept_length(scores: Sequence[float], stop_below: float) -> int:
    """How many of a chain's tokens to keep: the longest prefix whose product of scores
    stays >= ``stop_below``, at least one token (``stop_below`` 0: all of them)."""
    if stop_below <= 0:
        return len(scores)
    p, n = 1.0, 0
    for s in scores:
        p *= s
        if p < stop_below:
            break
        n += 1
    return max(1, n)


def truncate_rows(tokens: torch.Tensor, scores: torch.Tensor, stop_below: float) -> List[List[int]]:
    """Rows of a scored chain (tokens, scores (rows, n)) cut to ``kept_length``."""
    return [toks[:kept_length(sc, stop_below)] for toks, sc in zip(tokens.tolist(), scores.tolist())]
