"""Training-time unrolling of an MTP head: the loss of step k is taken on the head's own
chain, with the attention pattern that chain inference produces.

Step 1 runs at every position i on the target's features h_i. Step k >= 2 at position i
reads the step k-1 output of position i-1 (its own predicted feature) and attends like
the k-th link of a draft chain that left the accurate positions at i-k+1: step-1 keys at
positions <= i-k+1, and the step-j key at position i-k+j for j = 2..k (its own chain).
Keys of earlier steps are kept with their gradients.
"""
from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F

from ..layers.attention import AttentionBackend


def chain_mask(step: int, T: int, device=None) -> torch.Tensor:
    """(T, step * T) bool: which keys (step-major) the queries of ``step`` (1-based) may see.
    Every row sees at least its own key; rows without a real chain (i < step - 1) are
    left out of the loss."""
    i = torch.arange(T, device=device)[:, None]
    p = torch.arange(T, device=device)[None, :]
    blocks = [p <= i - step + 1]
    for j in range(2, step + 1):
        blocks.append(p == i - step + j)
    return torch.cat(blocks, dim=1)


def valid_rows(step: int, T: int, device=None) -> torch.Tensor:
    """(T,) bool: positions where step ``step`` continues a real chain."""
    return torch.arange(T, device=device) >= step - 1


class UnrollAttention(AttentionBackend):
    """Attention for ``batch_size`` windows of ``seq_len`` positions; each call is one unroll
    step and appends its keys and values to the ones of the earlier steps."""

    def __init__(self, batch_size: int, seq_len: int):
        self.B, self.T = batch_size, seq_len
        self.keys: List[torch.Tensor] = []
        self.values: List[torch.Tensor] = []

    def attend(self, layer_idx, q, k, v):
        B, T = self.B, self.T
        q, k, v = (t.view(B, T, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
        self.keys.append(k)
        self.values.append(v)
        step = len(self.keys)
        mask = chain_mask(step, T, q.device)
        out = F.scaled_dot_product_attention(q, torch.cat(self.keys, 2), torch.cat(self.values, 2),
                                             attn_mask=mask, enable_gqa=True)
        return out.transpose(1, 2).reshape(B * T, -1)
