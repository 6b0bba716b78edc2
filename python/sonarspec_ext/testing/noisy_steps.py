"""A simulated machine with noisy step times, for judging the adaptive speculation control
(``engine.spec_control``) where its measurements lie: shared VMs stretch some steps by
other tenants' work, and a few steps' drafts are accepted by luck.

A step of one sequence drafting K tokens takes ``fixed + per_row (1 + K) + per_draft K``
seconds, times a jitter of +-``jitter``; with probability ``stall_rate`` the step is also
stretched by a factor drawn from ``stall`` (the machine's other work). It gives 1 + the
number of leading drafts kept, each kept with probability ``acceptance`` given the ones
before. With ``lookup_rate`` > 0 a drafting step is instead, with that probability, a step
of lookup drafts (the context repeating itself): ``lookup_tokens`` drafts whatever K is,
each kept with probability ``lookup_acceptance`` given the ones before, verified at
``fixed + per_row (1 + lookup_tokens)`` seconds (the drafter does not run).
``controlled_throughput`` runs the controller on it; ``fixed_throughput`` runs
one draft length throughout on the same random draws (same seed) - the comparison the
controller's choice is judged by.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from ..engine.draft_acceptance import chain_tokens
from ..engine.spec_control import SpeculationControl


@dataclass(frozen=True)
class NoisyMachine:
    fixed: float          # seconds of a step besides its rows and drafts
    per_row: float        # seconds each verified row adds
    per_draft: float      # seconds each drafted token adds (the drafter)
    acceptance: float     # each draft kept with this probability given the ones before
    jitter: float = 0.03
    stall_rate: float = 0.2
    stall: Tuple[float, float] = (1.5, 3.0)
    lookup_rate: float = 0.0        # share of drafting steps that draft from the context
    lookup_tokens: int = 8
    lookup_acceptance: float = 0.82

    def seconds(self, k: int, lookup: bool = False) -> float:
        """A step drafting ``k`` tokens (or a lookup step) without noise."""
        if lookup:
            return self.fixed + self.per_row * (1 + self.lookup_tokens)
        return self.fixed + self.per_row * (1 + k) + self.per_draft * k

    def step(self, rng: random.Random, k: int) -> Tuple[float, int, bool]:
        """(seconds, tokens, whether a lookup step) of one step drafting ``k`` tokens."""
        lookup = k > 0 and self.lookup_rate > 0 and rng.random() < self.lookup_rate
        seconds = self.seconds(k, lookup) * rng.uniform(1 - self.jitter, 1 + self.jitter)
        if rng.random() < self.stall_rate:
            seconds *= rng.uniform(*self.stall)
        drafts, acceptance = (self.lookup_tokens, self.lookup_acceptance) if lookup else (k, self.acceptance)
        tokens = 1
        while tokens <= drafts and rng.random() < acceptance:
            tokens += 1
        return seconds, tokens, lookup

    def expected_rate(self, k: int) -> float:
        """Tokens per second of draft length ``k`` without noise."""
        f = self.lookup_rate if k > 0 else 0.0
        tokens = ((1 - f) * chain_tokens(self.acceptance, k)
                  + f * chain_tokens(self.lookup_acceptance, self.lookup_tokens))
        return tokens / ((1 - f) * self.seconds(k) + f * self.seconds(k, lookup=True))

    def best_length(self, modes: Sequence[int]) -> int:
        return max(modes, key=self.expected_rate)


# Draft lengths the controller chooses among (0: plain decoding), and machines with a 3.5 ms
# plain decoding step (fixed + one row) and different best lengths: SmolLM2 Q4_1 on a 2-core
# AMD Zen 4 VM (`tools/profile_spec.py`: 0.74 ms a verified row, 0.24 ms a drafted token,
# acceptance 0.65 on chat; K = 2 best, 1.33x plain), the same with lookup drafts (up to 8,
# a fifth of the drafting steps, 4.6 tokens each: chat replies with the packaged head,
# docs/bench/smollm2_lookup_chat_zen5.json; K = 2 best, 1.45x), rows nearly free (K = 4,
# 1.92x), and rows costing most of a step (plain decoding; K = 1 at 0.83x).
MODES = (4, 3, 2, 1, 0)
MACHINES = {
    "smollm2-zen4": NoisyMachine(fixed=0.00276, per_row=0.00074, per_draft=0.00024, acceptance=0.65),
    "smollm2-zen4-lookups": NoisyMachine(fixed=0.00276, per_row=0.00074, per_draft=0.00024, acceptance=0.65,
                                         lookup_rate=0.2),
    "memory-bound": NoisyMachine(fixed=0.00335, per_row=0.00015, per_draft=0.00024, acceptance=0.7),
    "compute-bound": NoisyMachine(fixed=0.001, per_row=0.0025, per_draft=0.0003, acceptance=0.5),
}


def _throughput(machine: NoisyMachine, seed: int, steps: int, control: Optional[SpeculationControl],
                k: int = 0) -> float:
    """Tokens per second over ``steps`` steps, each drafting ``control.mode`` tokens (the step
    then recorded by it) or, without a control, ``k``."""
    rng = random.Random(seed)
    seconds = tokens = 0.0
    for _ in range(steps):
        mode = k if control is None else control.mode
        s, t, lookup = machine.step(rng, mode)
        seconds, tokens = seconds + s, tokens + t
        if control is not None:
            control.record(s, t, measured=True, accepted=[t - 1] if mode else None, lookup=[lookup])
    return tokens / seconds


def controlled_throughput(machine: NoisyMachine, seed: int, steps: int, modes: Sequence[int] = MODES,
                          pool_acceptance: bool = True) -> float:
    """Tokens per second over ``steps`` steps run by a fresh ``SpeculationControl``."""
    return _throughput(machine, seed, steps, SpeculationControl(modes=modes, pool_acceptance=pool_acceptance))


def fixed_throughput(machine: NoisyMachine, seed: int, steps: int, k: int) -> float:
    """Tokens per second over ``steps`` steps all drafting ``k`` tokens."""
    return _throughput(machine, seed, steps, None, k)


def relative_throughputs(machine: NoisyMachine, seeds: int, steps: int, modes: Sequence[int] = MODES,
                         pool_acceptance: bool = True) -> list:
    """Per seed, the controller's throughput over the best fixed draft length's (sorted)."""
    best = machine.best_length(modes)
    return sorted(controlled_throughput(machine, s, steps, modes, pool_acceptance)
                  / fixed_throughput(machine, s, steps, best) for s in range(seeds))
