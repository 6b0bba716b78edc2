"""Speculation that pays for itself: each decoding step drafts as many tokens as have
measured the highest throughput on this machine, model and traffic - possibly none.

The modes are draft lengths, the configured one first, 0 meaning plain decoding. The
controller assumes throughput is unimodal in the draft length over K >= 1 (it rises while
the drafts' acceptance outweighs their cost, then falls) and climbs to the peak: it first
surveys the start mode and then, ``probe_steps`` measured steps each, the unmeasured
neighbours of the fastest mode so far - the lengths next to it, and plain decoding -
until all of them are measured slower; so a short run where speculation loses (64 streams
on a CPU, started from plain decoding) pays for one probe, not for every length. Then
decoding alternates between exploiting the fastest mode and briefly probing a neighbour:
``phase_steps`` steps of the current winner, then ``probe_steps`` of the next neighbour in
turn, after which the faster of the two runs; the winner's phases double (up to
``max_phase_steps``) each time a probe confirms it. A mode's rate is the output tokens per
second of the decode-only steps it ran (steps that also prefill are not comparable and are
not measured), averaged over its phases with weight ``decay`` on the past. Every mode gives
the same tokens (speculation is lossless), so the choice only moves speed: at worst a
probe's share of steps runs a slower mode.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence


class SpeculationControl:
    def __init__(self, modes: Sequence[int] = (1, 0), phase_steps: int = 16, probe_steps: int = 4,
                 max_phase_steps: int = 512, decay: float = 0.5):
        if (min(phase_steps, probe_steps) < 1 or max_phase_steps < phase_steps or not 0 <= decay < 1
                or len(modes) < 2 or len(set(modes)) != len(modes) or min(modes) < 0):
            raise ValueError("SpeculationControl needs two or more distinct draft lengths >= 0, phase_steps, "
                             "probe_steps >= 1, max_phase_steps >= phase_steps and 0 <= decay < 1")
        self.modes = tuple(modes)
        self._ladder = sorted(self.modes)   # the modes by draft length: neighbours are adjacent
        self.phase_steps, self.probe_steps, self.max_phase_steps, self.decay = (
            phase_steps, probe_steps, max_phase_steps, decay)
        self.rates: Dict[int, Optional[float]] = dict.fromkeys(self.modes)   # draft length -> tokens/s
        self.steps: Dict[int, int] = dict.fromkeys(self.modes, 0)            # decode steps run in each mode
        self.winner = self.modes[0]   # the configured draft length until measured otherwise
        self.mode = self.winner       # the next step's
        self._surveying = True        # climbing to the fastest mode, before the first phase
        self._probe = 0               # which neighbour of the winner the next probe runs
        self._left = probe_steps      # measured steps left in this phase
        self._exploit = phase_steps   # length of the winner's next phase
        self._seconds = 0.0
        self._tokens = 0
        self._fresh = False           # the next step is the first after a switch

    def start_with(self, mode: int) -> None:
        """Start the survey from ``mode`` (a verdict from elsewhere) instead."""
        if self.rates[self.mode] is None:
            self.winner = self.mode = mode

    def _neighbours(self, mode: int) -> List[int]:
        """The modes next to ``mode`` in draft length, the shorter first, and plain decoding:
        it has no drafting cost at all, so a drafter's fixed cost per step can make K = 1
        slower than both plain decoding and K = 2 (throughput is unimodal over K >= 1)."""
        i = self._ladder.index(mode)
        near = [self._ladder[j] for j in (i - 1, i + 1) if 0 <= j < len(self._ladder)]
        return near + [0] if mode != 0 and 0 in self.modes and 0 not in near else near

    @property
    def probing(self) -> bool:
        return self.mode != self.winner

    @property
    def speculate(self) -> bool:
        """Whether the next step drafts at all."""
        return self.mode != 0

    def record(self, seconds: float, tokens: int, measured: bool) -> None:
        """One step's wall time and output tokens; ``measured``: a decode-only step. The first
        step of a phase is not measured: it pays for the switch (a drafter catching up on the
        tokens decoded without it)."""
        mode = self.mode
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
        if self._surveying:   # climb: the fastest so far, and its neighbours not yet measured
            self.winner = max((m for m in self.modes if self.rates[m] is not None), key=lambda m: self.rates[m])
            todo = [m for m in self._neighbours(self.winner) if self.rates[m] is None]
            self._surveying = bool(todo)
            self.mode, self._left = (todo[0], self.probe_steps) if todo else (self.winner, self._exploit)
        elif self.probing:   # the probe's verdict: the faster mode runs next, longer if it won again
            if self.rates[mode] > self.rates[self.winner]:
                self.winner, self._exploit = mode, self.phase_steps
            else:
                self._exploit = min(self.max_phase_steps, 2 * self._exploit)
            self.mode, self._left = self.winner, self._exploit
        else:                 # the winner's phase is over: probe one of its neighbours
            near = self._neighbours(self.winner)
            self.mode, self._left = near[self._probe % len(near)], self.probe_steps
            self._probe += 1
        self._fresh = self.mode != mode


class BatchSpeculationControl:
    """One ``SpeculationControl`` per size class of the decoding batch (1, 2-3, 4-7, ...,
    32 and more sequences): speculation that pays for one stream rarely pays for 32, so each
    class learns its own winner, and the losing modes' probes there grow rare. A class seen
    for the first time starts its survey from the winner of the nearest class already seen."""

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        SpeculationControl(**kwargs)   # validates the settings
        self.classes: Dict[int, SpeculationControl] = {}

    def for_batch(self, num_decoding: int) -> SpeculationControl:
        c = min(max(num_decoding, 1).bit_length(), 6)
        if c not in self.classes:   # a new class starts with the winner of the nearest class seen
            new = SpeculationControl(**self._kwargs)
            if self.classes:
                new.start_with(self.classes[min(self.classes, key=lambda k: (abs(k - c), k))].winner)
            self.classes[c] = new
        return self.classes[c]

    def summary(self) -> dict:
        """Decode steps run speculating and plainly, and per class each draft length's
        measured tokens/s (0: plain decoding)."""
        steps = [c.steps for c in self.classes.values()]
        return {"speculating_steps": sum(n for s in steps for m, n in s.items() if m),
                "plain_steps": sum(s.get(0, 0) for s in steps),
                "classes": {f"{1 << (k - 1)}+": dict(c.rates) for k, c in sorted(self.classes.items())}}
