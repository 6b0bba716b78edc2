"""The distribution a sampled request draws from (temperature, top-k, top-p), native on
the CPU; ``ops.reference.processed_probs_reference`` is the torch version (what other
devices run, and the tests' oracle)."""
from __future__ import annotations

import torch

from .. import _C
from .linear import native_threads
from .reference import processed_probs_reference


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
