"""Write new keys and values into paged KV pools."""
from __future__ import annotations

import torch

from .. import _C
from .checks import check_cuda_build, check_tensor, stream_handle

_KV_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def kv_store(k_pool: torch.Tensor, v_pool: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """In place: ``k_pool[slot_mapping[i]] = k[i]`` and the same for values.

    k_pool, v_pool: (num_slots, num_kv_heads, head_dim); k, v: (num_tokens, num_kv_heads,
    head_dim) of the pool's dtype; slot_mapping: (num_tokens,) int64 on the same device.
    Negative slots (padding) are skipped; slots past the pool are a ValueError on the CPU
    (the other tokens are written) and skipped on CUDA.
    """
    check_tensor("k_pool", k_pool, dtypes=_KV_DTYPES, ndim=3)
    dev = k_pool.device
    check_tensor("v_pool", v_pool, dtypes=(k_pool.dtype,), ndim=3, device=dev)
    check_tensor("k", k, dtypes=(k_pool.dtype,), ndim=3, device=dev)
    check_tensor("v", v, dtypes=(k_pool.dtype,), ndim=3, device=dev)
    check_tensor("slot_mapping", slot_mapping, dtypes=(torch.int64,), ndim=1, device=dev)
    if v_pool.shape != k_pool.shape:
        raise ValueError(f"v_pool has shape {list(v_pool.shape)}, expected {list(k_pool.shape)} like k_pool")
    row = tuple(k_pool.shape[1:])
    for name, t in (("k", k), ("v", v)):
        if tuple(t.shape[1:]) != row or t.shape[0] != slot_mapping.shape[0]:
            raise ValueError(f"{name} has shape {list(t.shape)}, expected [{slot_mapping.shape[0]}, "
                             f"{row[0]}, {row[1]}]")
    check_cuda_build("kv_store", dev)
    past = _C.kv_store(k.data_ptr(), v.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), slot_mapping.data_ptr(),
                       slot_mapping.shape[0], k_pool[0].numel() * k_pool.element_size(), k_pool.shape[0],
                       dev.type == "cuda", stream_handle(dev))
    if past:   # counted on the CPU (a CUDA launch skips such slots without a host read)
        raise ValueError(f"{past} slot(s) in slot_mapping are past the pool's {k_pool.shape[0]} slots")
