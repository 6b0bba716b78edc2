"""Token sampling: temperature, top-k, top-p, per-request random streams.

Every request draws its randomness on its own (``engine.request.Request.uniforms``: a
generator of its own, or uniforms keyed by position for seeded requests), so its tokens
do not depend on which other requests share the batch.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..ops.sampling import processed_probs as sampling_probs
from ..ops.speculative import chain_sampling_from_logits, chain_speculative_sampling
from ..params import SamplingParams


def top_tokens(logits: torch.Tensor) -> List[int]:
    """The top token of each row of ``logits`` (n, vocab_size), or of a 1-D ``logits`` as a
    list of one: the first index among equal maxima (NaN counting as the maximum), as
    torch's argmax. float32 CPU rows go through numpy's argmax, about ten times faster
    than torch's for a few rows of a vocabulary."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        return np.atleast_1d(logits.numpy().argmax(-1)).tolist()
    return logits.argmax(-1).reshape(-1).tolist()


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from, (n, vocab_size) float32 (``ops.sampling``).
    Greedy requests get the one-hot of the argmax."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return sampling_probs(logits, params.temperature, params.top_k, params.top_p)


def processed_probs_rows(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """``processed_probs`` of each row of ``logits`` (n, vocab_size) with its own entry of
    ``params``: rows sharing sampling parameters go through one native call."""
    groups = {}
    for i, p in enumerate(params):
        groups.setdefault((p.greedy, p.temperature, p.top_k, p.top_p), []).append(i)
    if len(groups) == 1:   # one request's rows, or requests alike: no gather and scatter
        return processed_probs(logits, params[0])
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    for rows in groups.values():
        idx = torch.tensor(rows, device=logits.device)
        out[idx] = processed_probs(logits[idx], params[rows[0]])
    return out


def draw_rows(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` (n, vocab_size) by inverse CDF at ``uniforms`` (n,)
    float64, as an int64 device tensor (no host synchronisation): on the CPU the native chain
    sampler with no drafts, elsewhere ``inverse_cdf`` row by row in torch."""
    if probs.device.type != "cpu":
        return torch.stack([inverse_cdf(probs[r].double(), uniforms[r]) for r in range(probs.shape[0])]).long()
    n = probs.shape[0]
    return chain_speculative_sampling(None, torch.zeros(n, 0, dtype=torch.long), probs[:, None],
                                      uniforms=uniforms.view(n, 1))[0][:, 0].long()


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> List[int]:
    """``draw_rows`` as a list of token ids."""
    return draw_rows(probs, uniforms).tolist()


def sample(logits: torch.Tensor, params: Sequence[SamplingParams], seqs: Sequence) -> List[int]:
    """``logits``: (batch_size, vocab_size), one row per request -> one token id each (greedy
    rows take the top token; the others draw from their processed distribution by inverse
    CDF at the next uniform of their request, ``seqs[i].uniforms``: ``sample_chains`` with
    no drafts)."""
    out = top_tokens(logits)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        drawn = sample_chains(logits[rows] if len(rows) < len(params) else logits, [params[i] for i in rows],
                              [[]] * len(rows), None, torch.cat([seqs[i].uniforms(0, 1) for i in rows]))
        for i, (tokens, _) in zip(rows, drawn):
            out[i] = tokens[0]
    return out


def sample_chains(logits: torch.Tensor, params: Sequence[SamplingParams], draft_ids: Sequence[Sequence[int]],
                  draft_probs: Optional[torch.Tensor], uniforms: torch.Tensor) -> List[Tuple[List[int], int]]:
    """Rejection sampling of B chains of K drafts each (K = 0: one draw per chain) from the
    target's logits (B * (K + 1), vocab_size), chain b's rows with its ``params[b]`` (sampled
    requests), ``draft_ids`` B lists of K, ``draft_probs`` (B, K, vocab_size) or None (point
    masses), ``uniforms`` B * (K + 1) float64. Returns per chain (the emitted tokens: accepted
    drafts, then the correction or bonus token; the number of drafts accepted). CPU logits go
    through one native call (``ops.chain_sampling_from_logits``), others through
    ``sample_chains_from_probs``: the same tokens."""
    if not params:
        return []
    if logits.device.type != "cpu":
        return sample_chains_from_probs(logits, params, draft_ids, draft_probs, uniforms)
    B = len(params)
    if logits.dtype != torch.float32 or not logits.is_contiguous():
        logits = logits.float().contiguous()
    out, emitted = chain_sampling_from_logits(
        logits.view(B, logits.shape[0] // B, -1), [p.temperature for p in params], [p.top_k for p in params],
        [p.top_p for p in params], draft_ids, draft_probs, uniforms.tolist())
    return [(row[:a + 1], a) for row, a in zip(out, emitted)]


def sample_chains_from_probs(logits: torch.Tensor, params: Sequence[SamplingParams],
                             draft_ids: Sequence[Sequence[int]], draft_probs: Optional[torch.Tensor],
                             uniforms: torch.Tensor) -> List[Tuple[List[int], int]]:
    """``sample_chains`` on any device: the processed distributions as a tensor
    (``processed_probs_rows``), then ``ops.chain_speculative_sampling``."""
    B = len(params)
    K1 = logits.shape[0] // B
    probs = processed_probs_rows(logits, [p for p in params for _ in range(K1)]).view(B, K1, -1)
    ids = torch.tensor(draft_ids, dtype=torch.long, device=logits.device).view(B, K1 - 1)
    out, _, emitted = chain_speculative_sampling(draft_probs, ids, probs,
                                                 uniforms=uniforms.to(logits.device).view(B, K1))
    return [(row[:a + 1], a) for row, a in zip(out.tolist(), emitted.tolist())]


def inverse_cdf(residual: torch.Tensor, u) -> torch.Tensor:
    """Index drawn from a non-negative float64 row by inverse CDF: the first index whose
    running sum exceeds ``u`` times the row's total (the row itself when it sums to zero is
    the caller's concern). Works on device tensors without a host sync."""
    cum = residual.cumsum(0)
    return (cum > u * cum[-1]).int().argmax()
