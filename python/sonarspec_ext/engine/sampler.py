"""Token sampling: temperature, top-k, top-p, per-request random streams.

Every request draws its randomness from its own ``torch.Generator``, so its tokens do
not depend on which other requests share the batch.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ..params import SamplingParams


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Processed logits of shape (n, vocab_size): divided by ``temperature`` (> 0), then
    everything outside the top-k and outside the smallest nucleus of mass >= top_p set
    to -inf. The processed distribution is ``softmax`` of the result."""
    logits = logits.float() / temperature
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs
        remove_sorted = mass_before >= top_p
        remove_sorted[..., 0] = False
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from, (n, vocab_size) float32. Greedy requests
    get the one-hot of the argmax."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return filter_logits(logits, params.temperature, params.top_k, params.top_p).softmax(-1)


def sample_from_probs(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One draw per row of ``probs`` (n, vocab_size) via the exponential race
    argmax(p / E), E ~ Exp(1): exact categorical sampling without a cumsum."""
    e = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / e).argmax(-1)


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[Optional[torch.Generator]]) -> List[int]:
    """``logits``: (batch_size, vocab_size), one row per request -> one token id each."""
    out = logits.argmax(-1).tolist()
    for i, p in enumerate(params):
        if not p.greedy:
            probs = processed_probs(logits[i:i + 1], p)
            out[i] = int(sample_from_probs(probs, generators[i]).item())
    return out
