"""Steps that verified lookup drafts, measured apart from the draft lengths' own steps.

A drafter with lookup drafts (``ChainDrafter.lookup_tokens``) drafts from the context
instead of its chain wherever the context repeats itself - under any draft length K >= 1,
and as many tokens as the repetition offers rather than K. Such a step's tokens and seconds
say nothing about K: counted in K's measurements, a probe of a few steps would rank the
lengths by how often the text happened to repeat during it. So the adaptive control
(``engine.spec_control``) measures the chain steps of each length alone and these steps
on their own: the share f of speculating steps that drafted from the context and their
tokens and seconds per sequence. A draft length's rate is then

    ((1 - f) tokens_K + f tokens_lookup) / ((1 - f) seconds_K + f seconds_lookup)

where plain decoding, which never drafts, keeps its own rate. Exponentially weighted
averages over the last ``window`` speculating steps or so follow a text that starts or
stops repeating itself.
"""
from __future__ import annotations


class LookupSteps:
    def __init__(self, window: int = 256, min_samples: int = 4):
        if window < 1 or min_samples < 1:
            raise ValueError("LookupSteps needs window >= 1 and min_samples >= 1")
        self.keep = 1.0 - 1.0 / window
        self.min_samples = min_samples
        self.steps = 0.0      # weighted speculating steps
        self.lookups = 0.0    # weighted speculating steps that drafted from the context
        self.timed = 0.0      # weighted measured lookup steps
        self.tokens = 0.0     # their weighted tokens per sequence
        self.seconds = 0.0    # their weighted seconds per sequence
        self.samples = 0      # measured lookup steps, unweighted

    def count(self, lookup: bool) -> None:
        """A speculating step, measured or not: whether it drafted from the context."""
        self.steps = self.keep * self.steps + 1.0
        self.lookups = self.keep * self.lookups + float(lookup)

    def record(self, tokens: float, seconds: float) -> None:
        """A measured lookup step's tokens and seconds per sequence."""
        self.timed = self.keep * self.timed + 1.0
        self.tokens = self.keep * self.tokens + tokens
        self.seconds = self.keep * self.seconds + seconds
        self.samples += 1

    @property
    def share(self) -> float:
        return self.lookups / self.steps if self.steps else 0.0

    def rate(self, tokens: float, seconds: float) -> float:
        """Tokens/s of a draft length whose chain steps give ``tokens`` in ``seconds`` per
        sequence, its lookup steps counted at their measured share (none before
        ``min_samples`` of them are measured)."""
        if self.samples < self.min_samples:
            return tokens / seconds
        f = self.share
        return (((1 - f) * tokens + f * self.tokens / self.timed)
                / ((1 - f) * seconds + f * self.seconds / self.timed))
