"""Sampling: seeded reproducibility, batch independence, top-k/top-p vs transformers'
logits warpers, and the sampled distribution vs the processed target distribution."""
import pytest
import torch

from helpers.models import hf_load
from sonarspec_ext import LLM, SamplingParams
from sonarspec_ext.sampling.sampler import draw_rows, inverse_cdf
from sonarspec_ext.sampling.uniforms import GeneratorUniforms
from sonarspec_ext.testing.reference import filter_logits
from helpers.stats import assert_matches

def test_inverse_cdf_draws_match_the_distribution():
    """The native row draws (draw_rows on the CPU) and the torch inverse_cdf (other devices)
    pick the same token for every uniform, and follow the distribution (chi-square, 0.001)."""
    probs = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.03, 0.015, 0.005])
    u = torch.rand(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    draws = draw_rows(probs.expand(20000, -1).contiguous(), u)
    assert draws.dtype == torch.int64
    assert torch.equal(draws[:500], torch.stack([inverse_cdf(probs.double(), x) for x in u[:500]]).long())
    assert_matches(torch.bincount(draws, minlength=10), probs, "inverse CDF", min_df=9)
    # one-hot input is always its single support token
    onehot = torch.zeros(5, 10)
    onehot[torch.arange(5), torch.tensor([3, 1, 4, 1, 5])] = 1
    assert draw_rows(onehot, u[:5]).tolist() == [3, 1, 4, 1, 5]


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 5, 1.0), (0.7, 0, 0.9), (1.3, 50, 0.5),
                                                      (1.0, 0, 0.05), (2.0, 1, 1.0)])
def test_filter_matches_transformers_warpers(temperature, top_k, top_p):
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)
    logits = torch.randn(7, 111, generator=torch.Generator().manual_seed(1)) * 3
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1:
        ref = TopPLogitsWarper(top_p)(None, ref)
    ours = filter_logits(logits, temperature, top_k, top_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    torch.testing.assert_close(ours.softmax(-1), ref.softmax(-1))


def test_seeded_sampling_is_reproducible_and_batch_independent(llama_dir):
    llm = LLM(llama_dir)
    p = SamplingParams(max_tokens=12, temperature=1.0, top_k=40, top_p=0.95, seed=1234, ignore_eos=True)
    alone = llm.generate([[1, 2, 3]], p)[0].token_ids
    assert llm.generate([[1, 2, 3]], p)[0].token_ids == alone
    others = [[5] * 9, [7, 8], [100] * 30]
    mixed = llm.generate(others[:2] + [[1, 2, 3]] + others[2:],
                         [SamplingParams(max_tokens=12, temperature=0.8, seed=s) for s in (1, 2)] + [p]
                         + [SamplingParams(max_tokens=5, temperature=0)])
    assert mixed[2].token_ids == alone
    other_seed = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=12, temperature=1.0, top_k=40,
                                                          top_p=0.95, seed=99, ignore_eos=True))[0]
    assert other_seed.token_ids != alone


def test_engine_samples_the_processed_target_distribution(qwen_dir):
    """First tokens of 1500 differently seeded requests vs transformers' processed softmax."""
    prompt = [10, 20, 30, 40]
    temperature, top_k, top_p = 1.5, 20, 0.9
    hf = hf_load(qwen_dir)
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0, -1:]
    probs = filter_logits(logits, temperature, top_k, top_p).softmax(-1)[0].double()
    llm = LLM(qwen_dir, max_num_seqs=256)
    n = 1500
    outs = llm.generate([prompt] * n, [SamplingParams(max_tokens=1, temperature=temperature, top_k=top_k,
                                                      top_p=top_p, seed=s) for s in range(n)])
    counts = torch.bincount(torch.tensor([o.token_ids[0] for o in outs]), minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0, "sampled a token outside the top-k/top-p support"
    assert_matches(counts, probs, "first sampled token", min_df=3)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.3, 50, 0.5), (1.0, 0, 0.05),
                                                      (2.0, 1, 1.0), (0.8, 20, 0.95), (1.0, 0, 0.999)])
@pytest.mark.parametrize("vocab", [111, 8192])
def test_native_processed_probs_match_the_torch_reference(temperature, top_k, top_p, vocab):
    """ops.sampling.processed_probs against softmax(filter_logits): the same support up to a
    boundary token and probabilities within float32 rounding, on peaked and flat rows;
    ties at the k-th value keep every tied token."""
    from sonarspec_ext.testing.reference import processed_probs_reference
    from sonarspec_ext.ops.sampling import processed_probs
    g = torch.Generator().manual_seed(vocab)
    logits = torch.cat([torch.randn(6, vocab, generator=g) * 3, torch.randn(2, vocab, generator=g) * 0.1])
    if top_p == 1.0:   # a tie across the top-k boundary (a top-p boundary inside a tie has no single answer)
        logits[0, :7] = logits[0].max() + 1
    ours = processed_probs(logits, temperature, top_k, top_p)
    ref = processed_probs_reference(logits, temperature, top_k, top_p)
    # the supports agree up to the one token at the nucleus boundary, where float32 rounding of
    # the running mass may fall either way (its probability is then tiny)
    differ = (ours > 0) != (ref > 0)
    assert differ.sum(-1).max() <= 1
    assert float((ours + ref)[differ].sum()) < 1e-4 * max(1, int(differ.sum()))
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours.sum(-1), torch.ones(8), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="invalid sampling parameters"):
        processed_probs(logits, 0.0)
    with pytest.raises(ValueError, match="2-D"):
        processed_probs(logits[0], 1.0)


@pytest.mark.parametrize("vocab", [1, 2, 7, 13, 1000, 49152])
def test_native_top_k_keeps_exactly_the_values_at_or_above_the_kth(vocab):
    """The native top-k keeps a token iff its logit is >= the k-th largest (torch.topk's k-th
    value): every k, on rows with long ties, -inf entries, signed zeros, all-negative values
    and values packed into one narrow range, for vocabularies of awkward sizes."""
    from sonarspec_ext.ops.sampling import processed_probs
    g = torch.Generator().manual_seed(vocab)
    rows = [torch.randn(vocab, generator=g) * 3,
            torch.randint(-3, 3, (vocab,), generator=g).float(),                 # long ties
            torch.where(torch.rand(vocab, generator=g) < 0.3, float("-inf"), torch.randn(vocab, generator=g)),
            torch.randn(vocab, generator=g).abs().neg() - 50,                     # all negative
            8 + torch.rand(vocab, generator=g) * 1e-3,                            # one narrow range
            torch.where(torch.rand(vocab, generator=g) < 0.5, torch.tensor(0.0), torch.tensor(-0.0))]
    logits = torch.stack(rows)
    logits[2, 0] = 1.0   # at least one finite value per row
    ks = sorted({1, 2, 3, vocab // 2, vocab - 1, 40} & set(range(1, vocab)))
    for k in ks:
        probs = processed_probs(logits, 1.0, k)
        kth = torch.topk(logits, k, dim=-1).values[:, -1:]
        assert torch.equal(probs > 0, (logits >= kth) & torch.isfinite(logits)), k


def test_native_sampler_draws_the_processed_distribution():
    """engine.sampler.sample on the CPU (native distribution, inverse-CDF draws from each
    request's generator) against the processed probabilities: chi-square at 0.001."""
    from sonarspec_ext.sampling.sampler import sample
    from sonarspec_ext.testing.reference import processed_probs_reference
    logits = torch.randn(1, 40, generator=torch.Generator().manual_seed(3)) * 2
    params = SamplingParams(temperature=0.9, top_k=25, top_p=0.9)
    probs = processed_probs_reference(logits, 0.9, 25, 0.9)[0].double()
    n = 4000
    gens = [torch.Generator().manual_seed(s) for s in range(n)]
    draws = [sample(logits, [params], [GeneratorUniforms(g)])[0] for g in gens]
    counts = torch.bincount(torch.tensor(draws), minlength=40).double()
    assert counts[probs == 0].sum() == 0
    assert_matches(counts, probs, "native sampler", min_df=3)


def test_top_tokens_equal_torch_argmax_ties_and_nan_included():
    from sonarspec_ext.sampling.sampler import top_tokens
    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, 8192, generator=g)
    x[1, 10] = x[1, 20] = x[1].max() + 1          # tie: the first index wins
    x[2, 300] = float("nan")                       # NaN counts as the maximum
    x[3] = 0.0                                     # all equal
    x[4, 8191] = float("inf")
    for rows in (x, x[:, ::2], x.T.contiguous().T, x[5]):   # strided views and a 1-D row too
        assert top_tokens(rows) == rows.argmax(-1).reshape(-1).tolist()
    assert top_tokens(x)[1:4] == [10, 300, 0]
    assert top_tokens(x.to(torch.bfloat16)) == x.to(torch.bfloat16).argmax(-1).tolist()


@pytest.mark.parametrize("vocab", [1, 7, 8, 13, 8192, 8197])
def test_native_top_token_equals_torch_argmax_ties_nan_and_tails(vocab):
    """The drafting chains' native top token: torch.argmax's first maximum, NaN counting
    as the maximum, for vocabularies that are not a multiple of the vector width."""
    from sonarspec_ext import _C
    g = torch.Generator().manual_seed(vocab)
    rows = [torch.randn(vocab, generator=g) for _ in range(8)]
    rows[1][vocab // 3] = rows[1][vocab - 1] = rows[1].max() + 1      # a tie, one of them in the tail
    rows[2][vocab - 1] = float("nan")                                 # a NaN in the tail
    rows[3][vocab // 2] = float("nan")
    rows[3][0] = float("nan")
    rows[4].fill_(float("-inf"))
    rows[5].fill_(0.0)
    rows[6][vocab - 1] = float("inf")
    rows[7][vocab // 2] = float("inf")
    rows[7][vocab - 1] = float("inf")
    for r in rows:
        assert _C.top_token(r.data_ptr(), vocab) == int(r.argmax())
    with pytest.raises(ValueError, match="vocab"):
        _C.top_token(rows[0].data_ptr(), 0)
