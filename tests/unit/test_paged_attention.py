"""ops.paged_attention (native CPU kernel) against its torch reference, and the engine's
choice between it and SDPA."""
import numpy as np
import pytest
import torch

from sonarspec_ext import ops
from sonarspec_ext.ops.limits import NATIVE_ATTENTION_MAX_TOKENS
from sonarspec_ext.ops.linear import native_gemm_threads
from sonarspec_ext.runtime.metadata import TreeBlock, build_metadata, tree_bits
from sonarspec_ext.testing.reference import paged_attention_reference, tree_attention_cascade_reference
from helpers.attention_cases import full_mask_attention as _full_mask_attention, pages as _pages
from helpers.attention_cases import random_tree_ancestors as _random_tree_ancestors


def _case(T, H, Hkv, D, B, max_kv, seed, page_size=4):
    g = torch.Generator().manual_seed(seed)
    table, kv_slots, num_slots = _pages(B, max_kv, page_size, g)
    q = torch.randn(T, H, D, generator=g)
    k_pool, v_pool = torch.randn(num_slots, Hkv, D, generator=g), torch.randn(num_slots, Hkv, D, generator=g)
    token_seq = torch.randint(0, B, (T,), generator=g)
    key_end = torch.randint(1, max_kv + 1, (T,), generator=g)
    key_begin = (key_end - torch.randint(1, max_kv + 1, (T,), generator=g)).clamp_min(0)
    return (q, k_pool, v_pool, table, page_size, token_seq, key_begin, key_end), kv_slots


@pytest.mark.parametrize("T,H,Hkv,D,B,max_kv,page_size", [(1, 1, 1, 8, 1, 1, 1), (7, 4, 2, 64, 3, 37, 4),
                                                           (64, 8, 1, 40, 5, 300, 16), (5, 6, 3, 128, 2, 1000, 3),
                                                           (9, 12, 4, 96, 2, 700, 16), (3, 4, 4, 32, 1, 50, 8),
                                                           (4, 2, 1, 320, 1, 600, 16)])
def test_matches_reference(T, H, Hkv, D, B, max_kv, page_size):
    args, kv_slots = _case(T, H, Hkv, D, B, max_kv, seed=T * 31 + D, page_size=page_size)
    q, k_pool, v_pool, _, _, token_seq, key_begin, key_end = args
    scale = D ** -0.5
    torch.testing.assert_close(ops.paged_attention(*args, scale),
                               paged_attention_reference(q, k_pool, v_pool, kv_slots, token_seq, key_begin, key_end,
                                                         scale), rtol=2e-5, atol=2e-5)


def test_queries_without_keys_and_bad_tensors_are_refused():
    (q, k_pool, v_pool, table, ps, token_seq, key_begin, key_end), _ = _case(3, 2, 1, 8, 1, 10, 0)
    empty = key_end.clone()
    empty[1] = key_begin[1]
    with pytest.raises(ValueError, match="1 query token"):
        ops.paged_attention(q, k_pool, v_pool, table, ps, token_seq, key_begin, empty, 0.3)
    with pytest.raises(ValueError, match="q has dtype"):
        ops.paged_attention(q.double(), k_pool, v_pool, table, ps, token_seq, key_begin, key_end, 0.3)
    with pytest.raises(ValueError, match="key_end has 2 entries"):
        ops.paged_attention(q, k_pool, v_pool, table, ps, token_seq, key_begin, key_end[:2], 0.3)
    with pytest.raises(ValueError, match="k_pool has shape"):
        ops.paged_attention(q, k_pool[:, :, :4].contiguous(), v_pool, table, ps, token_seq, key_begin, key_end, 0.3)
    with pytest.raises(ValueError, match="page_size must be"):
        ops.paged_attention(q, k_pool, v_pool, table, 0, token_seq, key_begin, key_end, 0.3)


def test_extreme_indices_are_refused_without_overflow():
    """Key ranges, tree positions and page sizes near the int64 limits are refused (the
    tokens holding them counted as bad), and the call with those tokens' indices in range is
    answered. The kernel checks them without signed overflow (tools/sanitize_check.sh runs
    this under UndefinedBehaviorSanitizer, which aborts on one)."""
    (q, k_pool, v_pool, table, ps, token_seq, key_begin, key_end), _ = _case(3, 2, 1, 8, 1, 10, 0)
    lo, hi = -(1 << 63), (1 << 63) - 1
    for begin, end in [(6, lo), (hi, 5), (lo, hi), (6, hi)]:
        b, e = key_begin.clone(), key_end.clone()
        b[0], e[0] = begin, end
        with pytest.raises(ValueError, match="1 query token"):
            ops.paged_attention(q, k_pool, v_pool, table, ps, token_seq, b, e, 0.3)
    bits = torch.tensor([1, 1 << 62, -1])
    for tree_begin in (hi, hi - 62, lo):
        with pytest.raises(ValueError, match="3 query token"):
            ops.paged_attention(q, k_pool, v_pool, table, ps, token_seq, key_begin, key_end, 0.3,
                                tree_begin=torch.full((3,), tree_begin), tree_mask=bits)
    wide = table[:, :1].expand(1, 4).contiguous()   # 4 page ids: 4 x 2^62 positions would pass 2^63
    with pytest.raises(ValueError, match=r"spans 2\^63 positions"):
        ops.paged_attention(q, k_pool, v_pool, wide, 1 << 62, token_seq, key_begin, key_end, 0.3)
    out = ops.paged_attention(q, k_pool, v_pool, table, ps, token_seq, key_begin, key_end, 0.3)
    alone = ops.paged_attention(q[2:], k_pool, v_pool, table, ps, token_seq[2:], key_begin[2:], key_end[2:], 0.3)
    assert torch.equal(out[2:], alone)


def test_metadata_chooses_the_native_kernel_only_for_small_unmasked_steps():
    table = list(range(40))
    meta, _ = build_metadata([(10, 3, table), (0, 5, table)], 4, "cpu", sliding_window=4, native_attention=True)
    assert meta.mask is None   # the native kernel needs no mask
    token_seq, key_begin, key_end = meta.native
    assert token_seq.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert key_end.tolist() == [11, 12, 13, 1, 2, 3, 4, 5]
    assert key_begin.tolist() == [7, 8, 9, 0, 0, 0, 0, 1]
    big, _ = build_metadata([(0, NATIVE_ATTENTION_MAX_TOKENS + 1, table * 3)], 4, "cpu", native_attention=True)
    assert big.native is not None and big.mask is None   # any step size: per-token key ranges
    assert build_metadata([(10, 3, table)], 4, "cpu")[0].native is None   # not asked for (e.g. bf16 models)
    tree, _ = build_metadata([(10, 2, table)], 4, "cpu", native_attention=True,
                             trees=[TreeBlock(10, np.array([1, 3]), np.array([10, 11]))])
    token_seq, key_begin, key_end, tree_begin, tree_mask = tree.native
    assert key_end.tolist() == [10, 10] and tree_begin.tolist() == [10, 10] and tree_mask.tolist() == [1, 3]


@pytest.mark.parametrize("nodes,prefix", [(1, 1), (9, 40), (64, 200), (33, 0)])
def test_tree_cascade_equals_full_masked_attention(nodes, prefix):
    """Prefix keys plus a random tree's ancestor bits, merged in one pass (native) and as an
    explicit log-sum-exp cascade (torch), equal attention under the full dense mask."""
    g = torch.Generator().manual_seed(nodes * 7 + prefix)
    anc = _random_tree_ancestors(nodes, g)
    H, Hkv, D, L = 4, 2, 32, prefix + nodes + 3
    q = torch.randn(nodes, H, D, generator=g)
    table, kv_slots, num_slots = _pages(1, L, 8, g)
    k_pool, v_pool = torch.randn(num_slots, Hkv, D, generator=g), torch.randn(num_slots, Hkv, D, generator=g)
    zeros = torch.zeros(nodes, dtype=torch.long)
    key_end, tree_begin = zeros + prefix, zeros + prefix
    mask = torch.zeros(nodes, L, dtype=torch.bool)
    mask[:, :prefix] = True
    mask[:, prefix:prefix + nodes] = torch.from_numpy(anc)
    bits = torch.from_numpy(tree_bits(anc))
    args = (q, k_pool, v_pool, table, 8, zeros, zeros, key_end)
    want = _full_mask_attention(q, k_pool, v_pool, kv_slots, zeros, mask, D ** -0.5)
    torch.testing.assert_close(ops.paged_attention(*args, D ** -0.5, tree_begin, bits), want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(tree_attention_cascade_reference(q, k_pool, v_pool, kv_slots, zeros, zeros, key_end,
                                                                tree_begin, bits, D ** -0.5), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="go together"):
        ops.paged_attention(*args, D ** -0.5, tree_begin, None)


@pytest.mark.parametrize("H,Hkv,prefix,block", [(9, 3, 3000, 5), (4, 4, 700, 8), (32, 2, 40, 3), (6, 3, 515, 17),
                                                 (9, 3, 500, 17), (3, 1, 1020, 9)])
@pytest.mark.parametrize("tree", [False, True])
def test_a_token_reads_the_same_bits_alone_or_in_a_block(H, Hkv, prefix, block, tree):
    """Tokens of one sequence in one step (a verification block: causal key ends, or a
    tree block: one prefix plus ancestor bits) share their key reads; every token's output
    is the same bits as the token attended alone, at contexts that split its keys into
    several parallel runs too - also where the block's key counts straddle a split
    boundary (every 256 keys), so that its tokens have different numbers of runs - and
    equals the float64 reference; the same bits on 1, 2 or 4 threads (which change how the
    work is grouped into items)."""
    g = torch.Generator().manual_seed(H * prefix + block)
    D, ps = 64, 16
    L = prefix + block + 1
    table, kv_slots, num_slots = _pages(2, L, ps, g)
    k_pool, v_pool = torch.randn(num_slots, Hkv, D, generator=g), torch.randn(num_slots, Hkv, D, generator=g)
    q = torch.randn(block, H, D, generator=g) * 2
    seq = torch.ones(block, dtype=torch.long)
    begin = torch.zeros(block, dtype=torch.long)
    if tree:
        anc = _random_tree_ancestors(block, g)
        end = begin + prefix
        extra = (end.clone(), torch.from_numpy(tree_bits(anc)))
        mask = torch.zeros(block, L, dtype=torch.bool)
        mask[:, :prefix] = True
        mask[:, prefix:prefix + block] = torch.from_numpy(anc)
    else:
        end = prefix + 1 + torch.arange(block)
        extra = ()
        mask = torch.arange(L)[None, :] < end[:, None]
    args = (k_pool, v_pool, table, ps)
    together = ops.paged_attention(q, *args, seq, begin, end, D ** -0.5, *extra)
    for t in range(block):
        one = (seq[t:t + 1], begin[t:t + 1], end[t:t + 1])
        alone = ops.paged_attention(q[t:t + 1], *args, *one, D ** -0.5, *(e[t:t + 1] for e in extra))
        assert torch.equal(alone[0], together[t]), t
    for threads in (1, 2, 4):
        with native_gemm_threads(threads):
            assert torch.equal(ops.paged_attention(q, *args, seq, begin, end, D ** -0.5, *extra), together), threads
    want = _full_mask_attention(q, k_pool, v_pool, kv_slots, seq, mask, D ** -0.5)
    torch.testing.assert_close(together, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("D", [40, 64, 80, 96])
def test_16_bit_pools_read_as_their_float32_widening(kv_dtype, tree, D):
    """bfloat16 / float16 pools: the same bits as float32 attention over the pools widened
    exactly (queries, blocks, splits and tree ancestors alike)."""
    g = torch.Generator().manual_seed(int(tree))
    H, Hkv, ps, L = 6, 2, 16, 1100
    table, kv_slots, num_slots = _pages(2, L, ps, g)
    k16 = torch.randn(num_slots, Hkv, D, generator=g).to(kv_dtype)
    v16 = torch.randn(num_slots, Hkv, D, generator=g).to(kv_dtype)
    T = 7
    q = torch.randn(T, H, D, generator=g)
    seq = torch.tensor([0, 1, 1, 1, 0, 1, 1])
    begin = torch.zeros(T, dtype=torch.long)
    end = torch.tensor([1, 1000, 1001, 1002, 600, 7, 8])
    extra = (end.clone(), torch.tensor([1, 1, 3, 5, 1, 1, 3])) if tree else ()
    got = ops.paged_attention(q, k16, v16, table, ps, seq, begin, end, D ** -0.5, *extra)
    want = ops.paged_attention(q, k16.float(), v16.float(), table, ps, seq, begin, end, D ** -0.5, *extra)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="v_pool has dtype"):
        ops.paged_attention(q, k16, v16.float(), table, ps, seq, begin, end, D ** -0.5)
