"""The distribution a sampled request draws from (temperature, top-k, top-p), native on
the CPU; ``processed_probs_reference`` is the torch version (what other devices run, and
the tests' oracle)."""
from __future__ import annotations

import torch

from .. import _C
from .linear import native_threads


def processed_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits (n, vocab) -> float32 probabilities (n, vocab): softmax of logits / temperature
    with everything outside the top_k largest (ties with the k-th kept) and outside the
    smallest nucleus of mass >= top_p (descending order, the first token always kept) at
    zero. top_k 0 and top_p 1.0 disable those filters."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[-1] == 0:
        raise ValueError("logits must be a 2-D tensor (rows, vocab)")
    if not temperature > 0 or not 0 < top_p <= 1 or top_k < 0:
        raise ValueError(f"invalid sampling parameters: temperature {temperature}, top_k {top_k}, top_p {top_p}")
    if logits.device.type != "cpu" or (torch.is_grad_enabled() and logits.requires_grad):
        return processed_probs_reference(logits, temperature, top_k, top_p)
    x = logits.float().contiguous()
    out = torch.empty_like(x)
    _C.processed_probs(x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], float(temperature), int(top_k),
                       float(top_p), native_threads())
    return out


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


def processed_probs_reference(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """softmax of ``filter_logits``: the torch twin of ``ops.sampling.processed_probs``."""
    return filter_logits(logits, temperature, top_k, top_p).softmax(-1)
