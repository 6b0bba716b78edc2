"""Training-time unrolling of an MTP head: the loss of step k is taken on the head's own
chain, with the attention pattern that chain inference produces.

Step 1 runs at every position i on the target's features h_i. Step k >= 2 at position i
reads the step k-1 output of position i-1 (its own predicted feature) and attends like
the k-th link of a draft chain that left the accurate positions at i-k+1: step-1 keys at
positions <= i-k+1, and the step-j key at position i-k+j for j = 2..k (its own chain).
Keys of earlier steps are kept with their gradients. In packed windows
(``train.windows``) a query sees keys of its own segment only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from ..layers.attention import AttentionBackend, segment_mask


@dataclass
class WindowLayout:
    """Per token of a batch of windows (b, T): position in its segment, segment index (-1:
    padding), and whether the target's next-token prediction there is drafted (never in
    padding)."""
    positions: torch.Tensor
    segments: torch.Tensor
    drafted: torch.Tensor

    @classmethod
    def uniform(cls, b: int, T: int) -> "WindowLayout":
        """One segment per window, drafted everywhere."""
        return cls(torch.arange(T).expand(b, T), torch.zeros(b, T, dtype=torch.long),
                   torch.ones(b, T, dtype=torch.bool))


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


def valid_rows(step: int, layout: WindowLayout) -> torch.Tensor:
    """(b, T-1) bool: rows i (predicting the feature at i + 1) where step ``step`` continues
    a real chain inside one segment and the prediction at i + 1 is drafted."""
    pos, seg = layout.positions[:, :-1], layout.segments[:, :-1]
    return (pos >= step - 1) & (layout.segments[:, 1:] == seg) & layout.drafted[:, 1:]


class UnrollAttention(AttentionBackend):
    """Attention for ``batch_size`` windows of ``seq_len`` positions; each call of a layer is
    one unroll step of it and appends its keys and values to the ones of its earlier steps
    (per layer: a deeper head's layers each keep their own). ``segments``
    (batch_size, seq_len): queries see keys of their own segment only (None: one each)."""

    def __init__(self, batch_size: int, seq_len: int, segments: Optional[torch.Tensor] = None):
        self.B, self.T = batch_size, seq_len
        self.same = None if segments is None else segment_mask(segments)
        self.keys: Dict[int, List[torch.Tensor]] = {}
        self.values: Dict[int, List[torch.Tensor]] = {}

    def attend(self, layer_idx, q, k, v):
        B, T = self.B, self.T
        q, k, v = (t.view(B, T, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
        keys, values = self.keys.setdefault(layer_idx, []), self.values.setdefault(layer_idx, [])
        keys.append(k)
        values.append(v)
        step = len(keys)
        mask = chain_mask(step, T, q.device)
        if self.same is not None:   # (B, 1, T, step * T)
            mask = mask & self.same.repeat(1, 1, 1, step)
        out = F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2),
                                             attn_mask=mask, enable_gqa=True)
        return out.transpose(1, 2).reshape(B * T, -1)
