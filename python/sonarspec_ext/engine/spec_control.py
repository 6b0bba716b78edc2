"""Speculation that pays for itself: the engine's decoding speculates or decodes plainly
depending on which has measured the higher throughput on this machine, model and traffic.

Decoding alternates between exploiting the faster mode and briefly probing the other:
``phase_steps`` steps of the current winner (speculation at first), then ``probe_steps`` of
the other mode, after which the faster runs; the winner's phases double (up to
``max_phase_steps``) each time a probe confirms it. A
mode's rate is the output tokens per second of the decode-only steps it ran (steps that
also prefill are not comparable and are not measured), averaged over its phases with
weight ``decay`` on the past. Both modes give the same tokens (speculation is lossless),
so the choice only moves speed: at worst a probe's share of steps runs the slower mode.
"""
from __future__ import annotations

from typing import Dict, Optional


class SpeculationControl:
    def __init__(self, phase_steps: int = 16, probe_steps: int = 4, max_phase_steps: int = 512,
                 decay: float = 0.5):
        if min(phase_steps, probe_steps) < 1 or max_phase_steps < phase_steps or not 0 <= decay < 1:
            raise ValueError("SpeculationControl needs phase_steps, probe_steps >= 1, max_phase_steps >= "
                             "phase_steps and 0 <= decay < 1")
        self.phase_steps, self.probe_steps, self.max_phase_steps, self.decay = (
            phase_steps, probe_steps, max_phase_steps, decay)
        self.rates: Dict[bool, Optional[float]] = {True: None, False: None}   # speculating -> tokens/s
        self.winner = True            # speculation until measured otherwise
        self.probing = False
        self._left = phase_steps      # measured steps left in this phase
        self._exploit = phase_steps   # length of the winner's next phase
        self._seconds = 0.0
        self._tokens = 0
        self._fresh = False           # the next step is the first after a switch
        self.steps = {True: 0, False: 0}   # decode steps run in each mode

    @property
    def speculate(self) -> bool:
        """The mode of the next step."""
        return self.winner != self.probing

    def record(self, seconds: float, tokens: int, measured: bool) -> None:
        """One step's wall time and output tokens; ``measured``: a decode-only step. The first
        step of a phase is not measured: it pays for the switch (a drafter catching up on the
        tokens decoded without it)."""
        mode = self.speculate
        self.steps[mode] += 1
        if self._fresh:
            self._fresh = False
            return
        if not measured or seconds <= 0:
            return
        self._seconds += seconds
        self._tokens += tokens
        self._left -= 1
        if self._left > 0:
            return
        rate = self._tokens / self._seconds
        old = self.rates[mode]
        self.rates[mode] = rate if old is None else self.decay * old + (1 - self.decay) * rate
        self._seconds, self._tokens = 0.0, 0
        if self.probing:   # the probe's verdict: the faster mode runs next, longer if it won again
            self.probing = False
            if self.rates[mode] > self.rates[self.winner]:
                self.winner, self._exploit = mode, self.phase_steps
            else:
                self._exploit = min(self.max_phase_steps, 2 * self._exploit)
            self._left = self._exploit
        else:              # the winner's phase is over: probe the other mode
            self.probing, self._left = True, self.probe_steps
        self._fresh = self.speculate != mode


class BatchSpeculationControl:
    """One ``SpeculationControl`` per size class of the decoding batch (1, 2-3, 4-7, ...,
    32 and more sequences): speculation that pays for one stream rarely pays for 32, so each
    class learns its own winner, and the losing mode's probes there grow rare. A class seen
    for the first time starts with the winner of the nearest class already measured."""

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        SpeculationControl(**kwargs)   # validates the settings
        self.classes: Dict[int, SpeculationControl] = {}

    def for_batch(self, num_decoding: int) -> SpeculationControl:
        c = min(max(num_decoding, 1).bit_length(), 6)
        if c not in self.classes:   # a new class starts with the winner of the nearest class seen
            new = SpeculationControl(**self._kwargs)
            if self.classes:
                new.winner = self.classes[min(self.classes, key=lambda k: (abs(k - c), k))].winner
            self.classes[c] = new
        return self.classes[c]

    def summary(self) -> dict:
        """Decode steps run speculating and plainly, and per class its measured tokens/s."""
        return {"speculating_steps": sum(c.steps[True] for c in self.classes.values()),
                "plain_steps": sum(c.steps[False] for c in self.classes.values()),
                "classes": {f"{1 << (k - 1)}+": {"speculating_tok_s": c.rates[True], "plain_tok_s": c.rates[False]}
                            for k, c in sorted(self.classes.items())}}
