"""Statistics of finished requests kept as running totals: memory stays bounded however
many requests an engine serves."""
from __future__ import annotations

from typing import List

SUMMED = ("num_steps", "num_draft_tokens", "num_accepted_tokens", "num_lookup_steps", "num_lookup_accepted_tokens",
          "num_prompt_tokens", "num_cached_tokens", "num_output_tokens", "num_preemptions")


class RequestTotals:
    """Sums over finished requests of their ``Request.stats()`` counters, per-position
    draft counts included, and how many finished for each reason."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.num_requests = 0
        self.totals = dict.fromkeys(SUMMED, 0)
        self.drafted_per_position: List[int] = []
        self.accepted_per_position: List[int] = []
        self.finish_reasons: dict = {}

    def add(self, stats: dict, finish_reason: str) -> None:
        self.num_requests += 1
        for k in SUMMED:
            self.totals[k] += stats[k]
        drafted, accepted = stats["drafted_per_position"], stats["num_accepted_per_position"]
        grow = len(drafted) - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for k, (d, a) in enumerate(zip(drafted, accepted)):
            self.drafted_per_position[k] += d
            self.accepted_per_position[k] += a
        self.finish_reasons[finish_reason] = self.finish_reasons.get(finish_reason, 0) + 1

    def summary(self) -> dict:
        steps, accepted = self.totals["num_steps"], self.totals["num_accepted_tokens"]
        return {
            "num_requests": self.num_requests,
            **self.totals,
            "acceptance_length": (accepted + steps) / steps if steps else 0.0,
            "accepted_per_position": [a / max(d, 1) for a, d in zip(self.accepted_per_position,
                                                                     self.drafted_per_position)],
            "finish_reasons": dict(self.finish_reasons),
        }
