"""Paged KV cache: one pool tensor per model; page ids are shared between models."""
from __future__ import annotations

import torch

from ..models.config import ModelConfig
from ..ops.host_memory import huge_page_zeros


def bytes_per_page(cfg: ModelConfig, page_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * page_size * cfg.num_key_value_heads * cfg.head_dim * elem


def num_pages_for_budget(memory_bytes: int, pools, page_size: int) -> int:
    """How many pages fit in ``memory_bytes`` when every (config, dtype) in ``pools`` keeps
    a pool."""
    per_page = sum(bytes_per_page(c, page_size, dtype) for c, dtype in pools)
    return max(1, int(memory_bytes // per_page))


class KVCache:
    """Keys and values of one model: (num_layers, num_pages * page_size, num_kv_heads, head_dim).

    Slot ``page_id * page_size + offset`` holds the token at that offset of the page.
    """

    def __init__(self, cfg: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype, device):
        shape = (cfg.num_hidden_layers, num_pages * page_size, cfg.num_key_value_heads, cfg.head_dim)
        if torch.device(device).type == "cpu":   # attention streams them: on huge pages
            self.k, self.v = huge_page_zeros(shape, dtype), huge_page_zeros(shape, dtype)
            # The planner hands out page 0 first: the huge page holding its slots in each
            # layer is faulted in (zero-filled by the system) now, at load, rather than inside
            # the first request's prefill - 2 MiB per layer and pool that request would touch.
            self.k[:, :page_size].zero_()
            self.v[:, :page_size].zero_()
        else:
            self.k = torch.zeros(shape, dtype=dtype, device=device)
            self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_pages, self.page_size = num_pages, page_size

    def layer(self, i: int):
        return self.k[i], self.v[i]

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]

    def slots(self, page_table, positions):
        """Slots of ``positions`` in a sequence with ``page_table``, as a tensor."""
        pos = torch.as_tensor(positions, dtype=torch.long)
        table = torch.as_tensor(page_table, dtype=torch.long)
        return (table[pos // self.page_size] * self.page_size + pos % self.page_size).to(self.k.device)

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copies the K/V of slots ``src`` to slots ``dst`` in every layer (all reads first)."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]
