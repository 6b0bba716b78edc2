"""Tokens per step of each draft length, estimated from every speculating step at once.

A step that drafts K tokens for a sequence gives it 1 + (drafts kept) tokens, and that count
swings from 1 to K + 1 between steps, so a draft length's tokens per step measured over a
few probe steps is too noisy to rank lengths that differ by a few percent. But the first i
drafts of a chain are the same tokens whatever K is, so every step that ran some K >= i
tells whether position i is kept: pooled over all the steps, the estimate of K = 2 also
learns from the long phases that run K = 3, and a short probe only has to measure its step
time, which varies far less.
"""
from __future__ import annotations

from typing import List, Optional, Sequence


def chain_tokens(acceptance: float, k: int) -> float:
    """Tokens per step of K drafts each kept with probability ``acceptance`` given the ones
    before: ``1 + a + ... + a^K``."""
    return sum(acceptance ** i for i in range(k + 1))


def geometric_acceptance(tokens: float, k: int) -> float:
    """The per-token acceptance a at which K drafts give ``tokens`` per step on average
    (``chain_tokens``; solved by bisection, clamped to [0, 0.999])."""
    lo, hi = 0.0, 0.999
    if tokens <= 1.0:
        return lo
    if tokens >= chain_tokens(hi, k):
        return hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if chain_tokens(mid, k) < tokens else (lo, mid)
    return 0.5 * (lo + hi)


class DraftAcceptance:
    """Per draft position i, the share p_i of (sequence, step) samples of draft lengths >= i
    that kept i drafts or more - a sequence that drafted fewer (stopped early, or capped
    near its end) counts as not keeping it, as it gives that step no more tokens - as an
    exponentially weighted average over the position's last ``window`` samples or so.

    Positions past the first are seen only in the steps of the longer lengths - a few probe
    steps while a shorter length wins - so each is shrunk towards the geometric continuation
    of the positions before it (p_{i-1}^2 / p_{i-2}, as if ``prior_samples`` samples had
    shown it): a length's estimate moves smoothly from that extrapolation to its own counts.

    ``prior_acceptance``: p_1, p_2, ... as measured elsewhere (a drafter's validation run),
    counted as ``prior_samples`` samples at each of those positions that decay like the
    others: the estimates start there - a step's tokens are known before the first draft is
    verified - and a few unlucky first steps (a reply's opening, which the drafter rarely
    predicts) weigh against them instead of deciding alone.
    """

    def __init__(self, max_drafts: int, window: int = 256, min_samples: int = 16, prior_samples: float = 16.0,
                 prior_acceptance: Optional[Sequence[float]] = None):
        if max_drafts < 0 or window < 1 or min_samples < 1 or prior_samples < 0:
            raise ValueError("DraftAcceptance needs max_drafts >= 0, window >= 1, min_samples >= 1 and "
                             "prior_samples >= 0")
        prior = list(prior_acceptance or [])
        if not all(isinstance(p, (int, float)) and 0.0 <= p <= 1.0 for p in prior):
            raise ValueError(f"prior_acceptance must be shares in [0, 1], got {prior_acceptance!r}")
        prior = prior[:max_drafts]
        self.keep = 1.0 - 1.0 / window
        self.min_samples = min_samples
        self.prior_samples = prior_samples
        self.kept: List[float] = [prior_samples * p for p in prior] + [0.0] * (max_drafts - len(prior))
        self.tried: List[float] = [prior_samples] * len(prior) + [0.0] * (max_drafts - len(prior))
        # unweighted; prior samples count towards min_samples
        self.samples: List[int] = [int(prior_samples)] * len(prior) + [0] * (max_drafts - len(prior))
        self.seeded = len(prior)   # positions with a prior of their own: no geometric shrinkage

    def record(self, draft_length: int, accepted: Sequence[int]) -> None:
        """One step of ``draft_length`` (0: plain decoding, nothing learnt): the number of
        drafts each of its sequences kept."""
        for i in range(min(draft_length, len(self.tried))):
            for a in accepted:
                self.kept[i] = self.keep * self.kept[i] + (a > i)
                self.tried[i] = self.keep * self.tried[i] + 1.0
            self.samples[i] += len(accepted)

    def tokens_per_step(self, draft_length: int) -> Optional[float]:
        """1 + p_1 + ... + p_K, the expected tokens per sequence and step at K =
        ``draft_length``; None before the first position has ``min_samples`` samples, or
        past ``max_drafts``."""
        if draft_length > len(self.tried) or (draft_length > 0 and self.samples[0] < self.min_samples):
            return None
        p = [1.0]   # p_0: the step's own token
        for i in range(draft_length):
            prior = 0.0
            if i > 0:
                prior = p[i] * min(1.0, p[i] / p[i - 1]) if p[i - 1] > 0 else 0.0
            weight = self.prior_samples if i >= max(1, self.seeded) else 0.0
            p.append((self.kept[i] + weight * prior) / (self.tried[i] + weight))
        return sum(p)
