"""Token sampling: temperature, top-k, top-p, per-request random streams.

Every request draws its randomness from its own ``torch.Generator``, so its tokens do
not depend on which other requests share the batch.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ..ops.sampling import processed_probs as sampling_probs
from ..ops.speculative import chain_speculative_sampling
from ..params import SamplingParams


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from, (n, vocab_size) float32 (``ops.sampling``).
    Greedy requests get the one-hot of the argmax."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return sampling_probs(logits, params.temperature, params.top_k, params.top_p)


def sample_from_probs(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One draw per row of ``probs`` (n, vocab_size) via the exponential race
    argmax(p / E), E ~ Exp(1): exact categorical sampling without a cumsum."""
    e = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / e).argmax(-1)


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[Optional[torch.Generator]]) -> List[int]:
    """``logits``: (batch_size, vocab_size), one row per request -> one token id each. On the
    CPU the sampled rows draw together by inverse CDF, one float64 uniform from each
    request's generator (``ops.chain_speculative_sampling`` with no drafts); elsewhere by
    the exponential race."""
    out = logits.argmax(-1).tolist()
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return out
    probs = torch.cat([processed_probs(logits[i:i + 1], params[i]) for i in rows])
    if logits.device.type != "cpu":
        for r, i in enumerate(rows):
            out[i] = int(sample_from_probs(probs[r:r + 1], generators[i]).item())
        return out
    u = torch.stack([torch.rand(1, dtype=torch.float64, generator=generators[i]) for i in rows])
    drawn = chain_speculative_sampling(None, torch.zeros(len(rows), 0, dtype=torch.long), probs[:, None], uniforms=u)[0]
    for r, i in enumerate(rows):
        out[i] = int(drawn[r, 0])
    return out
