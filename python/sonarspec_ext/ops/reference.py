"""Torch reference implementations of the native ops (test oracles and fallbacks)."""
import torch


def kv_store_reference(k_pool: torch.Tensor, v_pool: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       slot_mapping: torch.Tensor) -> None:
    """pool[slot_mapping[i]] = src[i] for every token i with a valid slot."""
    valid = (slot_mapping >= 0) & (slot_mapping < k_pool.shape[0])
    k_pool[slot_mapping[valid]] = k[valid].to(k_pool.dtype)
    v_pool[slot_mapping[valid]] = v[valid].to(v_pool.dtype)
