"""Sampling: seeded reproducibility, batch independence, top-k/top-p vs transformers'
logits warpers, and the sampled distribution vs the processed target distribution."""
import pytest
import torch

from conftest import hf_load
from sonarspec_ext import LLM, SamplingParams
from sonarspec_ext.engine.sampler import filter_logits, sample_from_probs
from stats import assert_matches

def test_exponential_race_matches_distribution():
    probs = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.03, 0.015, 0.005])
    g = torch.Generator().manual_seed(0)
    draws = sample_from_probs(probs.expand(20000, -1).contiguous(), g)
    assert_matches(torch.bincount(draws, minlength=10), probs, "exponential race", min_df=9)
    # one-hot input is always its single support token
    onehot = torch.zeros(5, 10)
    onehot[torch.arange(5), torch.tensor([3, 1, 4, 1, 5])] = 1
    assert sample_from_probs(onehot, g).tolist() == [3, 1, 4, 1, 5]


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
