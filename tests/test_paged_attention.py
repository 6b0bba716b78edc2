"""ops.paged_attention (native CPU kernel) against its torch reference, and the engine's
choice between it and SDPA."""
import pytest
import torch

from sonarspec_ext import ops
from sonarspec_ext.engine.metadata import NATIVE_ATTENTION_MAX_TOKENS, build_metadata
from sonarspec_ext.ops.reference import paged_attention_reference


def _case(T, H, Hkv, D, B, max_kv, seed):
    g = torch.Generator().manual_seed(seed)
    num_slots = B * max_kv + 7
    q = torch.randn(T, H, D, generator=g)
    k_pool, v_pool = torch.randn(num_slots, Hkv, D, generator=g), torch.randn(num_slots, Hkv, D, generator=g)
    kv_slots = torch.stack([torch.randperm(num_slots, generator=g)[:max_kv] for _ in range(B)])
    token_seq = torch.randint(0, B, (T,), generator=g)
    key_end = torch.randint(1, max_kv + 1, (T,), generator=g)
    key_begin = (key_end - torch.randint(1, max_kv + 1, (T,), generator=g)).clamp_min(0)
    return q, k_pool, v_pool, kv_slots, token_seq, key_begin, key_end


@pytest.mark.parametrize("T,H,Hkv,D,B,max_kv", [(1, 1, 1, 8, 1, 1), (7, 4, 2, 64, 3, 37), (64, 8, 1, 40, 5, 300),
                                                 (5, 6, 3, 128, 2, 1000)])
def test_matches_reference(T, H, Hkv, D, B, max_kv):
    args = _case(T, H, Hkv, D, B, max_kv, seed=T * 31 + D)
    scale = D ** -0.5
    torch.testing.assert_close(ops.paged_attention(*args, scale), paged_attention_reference(*args, scale),
                               rtol=2e-5, atol=2e-5)


def test_empty_key_range_gives_zeros_and_bad_tensors_are_refused():
    q, k_pool, v_pool, kv_slots, token_seq, key_begin, key_end = _case(3, 2, 1, 8, 1, 10, 0)
    key_end[1] = key_begin[1]
    out = ops.paged_attention(q, k_pool, v_pool, kv_slots, token_seq, key_begin, key_end, 0.3)
    assert torch.equal(out[1], torch.zeros(16))
    with pytest.raises(ValueError, match="q has dtype"):
        ops.paged_attention(q.double(), k_pool, v_pool, kv_slots, token_seq, key_begin, key_end, 0.3)
    with pytest.raises(ValueError, match="key_end has 2 entries"):
        ops.paged_attention(q, k_pool, v_pool, kv_slots, token_seq, key_begin, key_end[:2], 0.3)
    with pytest.raises(ValueError, match="k_pool has shape"):
        ops.paged_attention(q, k_pool[:, :, :4].contiguous(), v_pool, kv_slots, token_seq, key_begin, key_end, 0.3)


def test_metadata_chooses_the_native_kernel_only_for_small_unmasked_steps():
    table = list(range(40))
    meta, _ = build_metadata([(10, 3, table), (0, 5, table)], 4, "cpu", sliding_window=4, native_attention=True)
    assert meta.mask is None   # the native kernel needs no mask
    token_seq, key_begin, key_end = meta.native
    assert token_seq.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert key_end.tolist() == [11, 12, 13, 1, 2, 3, 4, 5]
    assert key_begin.tolist() == [7, 8, 9, 0, 0, 0, 0, 1]
    big, _ = build_metadata([(0, NATIVE_ATTENTION_MAX_TOKENS + 1, table * 3)], 4, "cpu", native_attention=True)
    assert big.native is None and big.mask is not None
    assert build_metadata([(10, 3, table)], 4, "cpu")[0].native is None   # not asked for (e.g. bf16 models)
    import numpy as np
    tree, _ = build_metadata([(10, 2, table)], 4, "cpu", query_masks=[np.ones((2, 2), dtype=bool)],
                             native_attention=True)
    assert tree.native is None
