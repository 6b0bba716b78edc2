"""Where sampled tokens get their randomness: uniforms keyed by (seed, output position)
for seeded requests, a generator of its own for the others.

A seeded sampled request draws its output token j as the inverse CDF of the processed
target distribution at ``keyed_uniforms(seed, j, 1)``, whatever else happens: its drafts
are drawn with the same uniform at the same position (the drafter's distribution in
place of the target's) and a drafted token is accepted exactly when it equals the target's
own draw there. The tokens are then a function of (model, prompt, parameters, seed) alone -
the same with any drafter or none, any batch, any draft length the load control picks -
and each one is an exact draw from the target's distribution given the tokens before it
(the uniforms of different positions are independent). The price is acceptance: the
coupling of two inverse CDFs agrees less often than rejection sampling, which unseeded
requests use (``docs/speculation.md`` has the numbers).

The uniforms come from SplitMix64 (Steele, Lea and Flood, 2014) over the seed's own
SplitMix64 hash plus the position times the golden-ratio increment: 53-bit floats in
[0, 1), in exact integer arithmetic: identical on every machine.
"""
from __future__ import annotations

from typing import Optional

import torch

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15   # the golden-ratio increment


def _mix(z: int) -> int:
    """SplitMix64's output function of a 64-bit value."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def keyed_uniforms(seed: int, first: int, count: int, device=None) -> torch.Tensor:
    """(count,) float64 uniforms in [0, 1) for output positions first .. first + count - 1
    of a request seeded with ``seed`` (any 64-bit signed or unsigned integer)."""
    if first < 0 or count < 0:
        raise ValueError(f"keyed_uniforms needs first >= 0 and count >= 0, got {first} and {count}")
    key = _mix((seed + _GAMMA) & _MASK)
    u = torch.tensor([(_mix((key + (first + i + 1) * _GAMMA) & _MASK) >> 11) * (1.0 / (1 << 53))
                      for i in range(count)], dtype=torch.float64)
    if device is None or torch.device(device).type == "cpu":
        return u
    return u.pin_memory().to(device, non_blocking=True)   # no host synchronisation on a GPU


def new_generator(device) -> torch.Generator:
    """The generator of an unseeded request, seeded from the operating system's entropy."""
    g = torch.Generator(device=device)
    g.seed()
    return g


class KeyedUniforms:
    """The uniforms of a seeded request whose next output token is at ``position``."""
    keyed_sampling = True
    generator = None

    def __init__(self, seed: int, position: int, device=None):
        self.seed, self.position, self.device = seed, position, device

    def uniforms(self, offset: int, count: int) -> torch.Tensor:
        """(count,) float64 uniforms of the output positions ``offset`` and on past ``position``."""
        return keyed_uniforms(self.seed, self.position + offset, count, self.device)


class GeneratorUniforms:
    """The uniforms of an unseeded request: the next draws of ``generator``, whatever the offset."""
    keyed_sampling = False

    def __init__(self, generator: Optional[torch.Generator]):
        self.generator = generator

    def uniforms(self, offset: int, count: int) -> torch.Tensor:
        """The generator's next ``count`` float64 uniforms (``offset`` plays no part)."""
        dev = self.generator.device if self.generator is not None else None
        return torch.rand(count, dtype=torch.float64, generator=self.generator, device=dev)
