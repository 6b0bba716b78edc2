"""ops.paged_attention on CUDA (tools/gpu_check.sh runs these on a GPU machine; skipped
elsewhere): against the float64 dense-mask oracle for prefixes, causal blocks and draft
trees, across head sizes, GQA groups and dtypes, with key lists that span several splits;
a token's output the same bits alone or in a step; bad tokens counted and zeroed; the
engine's greedy output with the kernel equal to SDPA's."""
import pytest
import torch

from sonarspec_ext import LLM, SamplingParams, ops
from sonarspec_ext.ops.paged_attention import cuda_attention_supports
from sonarspec_ext.runtime.metadata import tree_bits
from helpers.attention_cases import full_mask_attention, pages, random_tree_ancestors

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
# ||out - ref|| / ||ref|| bounds: float32 arithmetic; 16-bit inputs and outputs (rounded once)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _random_case(T, H, Hkv, D, B, max_kv, page_size, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    table, kv_slots, num_slots = pages(B, max_kv, page_size, g)
    q = torch.randn(T, H, D, generator=g).to(dtype)
    k_pool = torch.randn(num_slots, Hkv, D, generator=g).to(dtype)
    v_pool = torch.randn(num_slots, Hkv, D, generator=g).to(dtype)
    token_seq = torch.randint(0, B, (T,), generator=g)
    key_end = torch.randint(1, max_kv + 1, (T,), generator=g)
    key_begin = (key_end - torch.randint(1, max_kv + 1, (T,), generator=g)).clamp_min(0)
    mask = (torch.arange(max_kv) >= key_begin[:, None]) & (torch.arange(max_kv) < key_end[:, None])
    return (q, k_pool, v_pool, table, page_size, token_seq, key_begin, key_end), kv_slots, mask


def _cuda(args):
    return tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)


def _rel_err(out, ref):
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("T,H,Hkv,D,B,max_kv,page_size", [(1, 1, 1, 32, 1, 1, 1), (7, 4, 2, 64, 3, 37, 4),
                                                           (64, 9, 3, 64, 5, 300, 16), (5, 32, 8, 128, 2, 1000, 16),
                                                           (9, 12, 1, 96, 2, 700, 16), (4, 2, 1, 256, 1, 600, 8),
                                                           (3, 24, 2, 128, 1, 2100, 16)])
def test_matches_the_dense_mask_oracle(T, H, Hkv, D, B, max_kv, page_size, dtype):
    args, kv_slots, mask = _random_case(T, H, Hkv, D, B, max_kv, page_size, dtype, seed=T * 31 + D + H)
    q, k_pool, v_pool, _, _, token_seq, _, _ = args
    out = ops.paged_attention(*_cuda(args), D ** -0.5)
    assert out.dtype == dtype and out.shape == (T, H * D) and torch.isfinite(out).all()
    ref = full_mask_attention(q.float(), k_pool.float(), v_pool.float(), kv_slots, token_seq, mask, D ** -0.5)
    assert _rel_err(out.cpu(), ref) < TOL[dtype]


@pytest.mark.parametrize("nodes,prefix", [(1, 1), (16, 40), (64, 200), (64, 230), (33, 0), (32, 1500)])
def test_tree_blocks_match_the_oracle(nodes, prefix):
    """Prefix keys plus a random tree's ancestor bits, also where they straddle splits."""
    g = torch.Generator().manual_seed(nodes * 7 + prefix)
    anc = random_tree_ancestors(nodes, g)
    H, Hkv, D, L, ps = 8, 2, 64, prefix + nodes + 3, 16
    q = torch.randn(nodes, H, D, generator=g)
    table, kv_slots, num_slots = pages(1, L, ps, g)
    k_pool, v_pool = torch.randn(num_slots, Hkv, D, generator=g), torch.randn(num_slots, Hkv, D, generator=g)
    zeros = torch.zeros(nodes, dtype=torch.long)
    mask = torch.zeros(nodes, L, dtype=torch.bool)
    mask[:, :prefix] = True
    mask[:, prefix:prefix + nodes] = torch.from_numpy(anc)
    bits = torch.from_numpy(tree_bits(anc))
    args = _cuda((q, k_pool, v_pool, table, ps, zeros, zeros, zeros + prefix))
    out = ops.paged_attention(*args, D ** -0.5, (zeros + prefix).cuda(), bits.cuda())
    assert _rel_err(out.cpu(), full_mask_attention(q, k_pool, v_pool, kv_slots, zeros, mask, D ** -0.5)) < 1e-5


@pytest.mark.parametrize("prefix,block", [(40, 5), (250, 9), (1020, 17)])
def test_a_token_reads_the_same_bits_alone_or_in_a_step(prefix, block):
    """Verification equals decoding bit for bit: a causal block's tokens, each alone, and
    the block inside a larger step with other sequences give the same output bits."""
    g = torch.Generator().manual_seed(prefix + block)
    H, Hkv, D, ps = 9, 3, 64, 16
    L = prefix + block + 40
    table, _, num_slots = pages(3, L, ps, g)
    dt = torch.bfloat16
    k_pool = torch.randn(num_slots, Hkv, D, generator=g).to(dt).cuda()
    v_pool = torch.randn(num_slots, Hkv, D, generator=g).to(dt).cuda()
    q = torch.randn(block, H, D, generator=g).to(dt).cuda()
    seq = torch.ones(block, dtype=torch.long)
    begin, end = torch.zeros(block, dtype=torch.long), prefix + 1 + torch.arange(block)
    common = (k_pool, v_pool, table.cuda(), ps)
    together = ops.paged_attention(q, *common, seq.cuda(), begin.cuda(), end.cuda(), D ** -0.5)
    for t in range(block):
        alone = ops.paged_attention(q[t:t + 1], *common, seq[t:t + 1].cuda(), begin[t:t + 1].cuda(),
                                    end[t:t + 1].cuda(), D ** -0.5)
        assert torch.equal(alone, together[t:t + 1])
    others = torch.randn(6, H, D, generator=g).to(dt).cuda()
    zeros = torch.zeros(3, dtype=torch.long)
    step = ops.paged_attention(torch.cat([others[:3], q, others[3:]]), *common,
                               torch.cat([zeros, seq, torch.full((3,), 2)]).cuda(),
                               torch.cat([zeros, begin, zeros]).cuda(),
                               torch.cat([torch.full((3,), L), end, torch.full((3,), 7)]).cuda(), D ** -0.5)
    assert torch.equal(step[3:3 + block], together)


def test_bad_tokens_are_counted_and_zeroed():
    args, kv_slots, mask = _random_case(4, 4, 2, 64, 4, 50, 8, torch.float32, seed=3)
    q, k_pool, v_pool, table, ps, _, key_begin, key_end = args
    token_seq = torch.arange(4)                  # the reference's token rows are their own
    mask = (torch.arange(50) >= key_begin[:, None]) & (torch.arange(50) < key_end[:, None])
    bad_table = table.clone()
    bad_table[1] = 10 ** 6                       # page ids outside the pool
    empty = key_end.clone()
    empty[2] = key_begin[2]                      # no key at all
    seq = token_seq.clone()
    seq[3] = 4                                   # a row outside the table
    cases = [(bad_table, token_seq, empty), (table, seq, key_end)]
    for tbl, ts, ke in cases:
        with pytest.raises(ValueError, match="query token"):
            ops.paged_attention(*_cuda((q, k_pool, v_pool, tbl, ps, ts, key_begin, ke)), 0.125)
    out = ops.paged_attention(*_cuda((q, k_pool, v_pool, bad_table, ps, token_seq, key_begin, empty)), 0.125,
                              check=False).cpu()
    ref = full_mask_attention(q, k_pool, v_pool, kv_slots, token_seq, mask, 0.125)
    assert (out[1:3] == 0).all() and _rel_err(out[[0, 3]], ref[[0, 3]]) < 1e-5
    with pytest.raises(ValueError, match="head_dim 32, 64"):
        ops.paged_attention(*_cuda((q[..., :48].contiguous(), k_pool[..., :48].contiguous(),
                                    v_pool[..., :48].contiguous(), table, ps, token_seq, key_begin, key_end)), 0.1)
    assert cuda_attention_supports(128) and not cuda_attention_supports(80)


def test_engine_greedy_output_equal_with_the_kernel_and_with_sdpa():
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompts = ["def parse_args(argv):\n", "class Stack:\n    def __init__(self):\n", "import os\n"]
    outs = []
    for kernel in (True, False):
        llm = LLM("default", device="cuda", dtype="float32")
        llm.engine.runner.cuda_attention = kernel
        outs.append([o.token_ids for o in llm.generate(prompts, params)])
        assert (llm.engine.runner.native_attention) == kernel
    assert outs[0] == outs[1]
