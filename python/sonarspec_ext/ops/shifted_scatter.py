"""Shifted-buffer scatter: the MTP head's input tokens from the target's, on the device."""
from __future__ import annotations

import torch

from .. import _C
from .checks import check_cuda_build, check_tensor, stream_handle


def shifted_scatter(input_ids: torch.Tensor, block_starts: torch.Tensor, block_lens: torch.Tensor,
                    next_tokens: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """The head at position i reads token i + 1: returns ``input_ids`` (num_tokens,) shifted
    one step left inside each sequence's block, with ``next_tokens[b]`` (the correction or
    bonus token) written at offset ``accepted[b]`` of block b and in its last slot.

    All tensors int64 on one device; block_starts, block_lens, next_tokens, accepted:
    (num_blocks,). ``accepted`` stays on the device: no host synchronisation. Blocks whose
    accepted count is outside [0, len) are copied unshifted. A block range outside
    ``input_ids`` is a ValueError on the CPU; on CUDA (where checking would wait for the
    device) the kernel leaves such a block unshifted."""
    check_tensor("input_ids", input_ids, dtypes=(torch.int64,), ndim=1)
    dev = input_ids.device
    for name, t in (("block_starts", block_starts), ("block_lens", block_lens), ("next_tokens", next_tokens),
                    ("accepted", accepted)):
        check_tensor(name, t, dtypes=(torch.int64,), ndim=1, device=dev)
        if t.shape[0] != block_starts.shape[0]:
            raise ValueError(f"{name} has {t.shape[0]} entries, expected {block_starts.shape[0]} (one per block)")
    check_cuda_build("shifted_scatter", dev)
    n = input_ids.shape[0]
    out = input_ids.clone()
    bad = _C.shifted_scatter(input_ids.data_ptr(), out.data_ptr(), block_starts.data_ptr(), block_lens.data_ptr(),
                             next_tokens.data_ptr(), accepted.data_ptr(), block_starts.shape[0], n,
                             dev.type == "cuda", stream_handle(dev))
    if dev.type == "cpu" and bad:   # (the CPU kernel's count; on CUDA, bad is the launch status)
        raise ValueError(f"{bad} block(s) cover tokens outside input_ids' {n} tokens (block_starts / block_lens "
                         f"out of range)")
    return out
