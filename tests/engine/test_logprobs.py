"""Output-token log-probabilities (``SamplingParams.logprobs``): the target's raw
distribution, checked against transformers on the same weights, equal under every
speculation scheme to plain decoding's, one per kept token at stop conditions."""
import math

import pytest
import torch

from helpers.models import hf_load
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from helpers.prompts import prompts

PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=3)


def _check_against(ref_logits: torch.Tensor, prompt, out, num_top: int) -> None:
    """``out.logprobs`` against log_softmax of the reference logits of prompt + output."""
    logp = torch.log_softmax(ref_logits.double(), -1)
    assert len(out.logprobs) == len(out.token_ids)
    for i, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        row = logp[len(prompt) - 1 + i]
        assert entry.token_id == tok
        assert math.isclose(entry.logprob, row[tok].item(), abs_tol=2e-4)
        assert len(entry.top) == num_top
        ids = [t for t, _ in entry.top]
        values = [v for _, v in entry.top]
        assert values == sorted(values, reverse=True)
        ref_top = row.topk(num_top)
        torch.testing.assert_close(torch.tensor(values, dtype=torch.float64), ref_top.values, atol=2e-4, rtol=0)
        assert len(set(ids)) == num_top


def test_plain_decoding_logprobs_match_transformers(llama_dir):
    llm = LLM(llama_dir, compact_weights=False)
    hf = hf_load(llama_dir)
    ps = prompts(4, seed=90)
    sampled = SamplingParams(max_tokens=12, temperature=0.8, seed=3, ignore_eos=True, logprobs=2)
    for params in (PARAMS, sampled):
        for p, out in zip(ps, llm.generate(ps, params)):
            with torch.no_grad():
                ref = hf(torch.tensor([p + out.token_ids])).logits[0]
            _check_against(ref, p, out, params.logprobs)
            if params.greedy:   # the greedy token is the most likely one
                assert all(e.top[0][0] == e.token_id for e in out.logprobs)


@pytest.mark.parametrize("spec", [
    dict(method="ngram", num_draft_tokens=3),
    dict(method="draft_target", num_draft_tokens=3),   # the target as its own draft: all accepted
    dict(method="mtp", num_draft_tokens=3),
    dict(method="mtp", num_draft_tokens=1),       # the single-token schedule
    dict(method="eagle_tree", num_draft_tokens=3),
], ids=["ngram", "draft_target", "mtp3", "mtp1", "eagle_tree"])
def test_speculative_logprobs_equal_plain_decoding(spec, llama_dir, heads):
    draft = {"draft_target": llama_dir, "mtp": heads["trained"], "eagle_tree": heads["trained"]}.get(spec["method"])
    ps = prompts(6, seed=91)
    plain = LLM(llama_dir).generate(ps, PARAMS)
    llm = LLM(llama_dir, spec=SpecConfig(draft=draft, **spec))
    outs = llm.generate(ps, PARAMS)
    assert llm.stats()["num_accepted_tokens"] > 0
    for a, b in zip(plain, outs):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.token_id == y.token_id and math.isclose(x.logprob, y.logprob, abs_tol=1e-4)
            assert [t for t, _ in x.top] == [t for t, _ in y.top]


def test_logprobs_stop_with_the_output_and_are_off_by_default(llama_dir):
    llm = LLM(llama_dir, spec=SpecConfig(method="ngram", num_draft_tokens=4))
    ps = prompts(4, seed=92)
    full = llm.generate(ps, PARAMS)
    stop_at = [o.token_ids[4] for o in full]
    for p, f, tok in zip(ps, full, stop_at):
        out = llm.generate([p], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[tok], logprobs=0))[0]
        assert out.finish_reason == "stop" and len(out.logprobs) == len(out.token_ids) <= 5
        assert [e.token_id for e in out.logprobs] == out.token_ids and all(e.top == [] for e in out.logprobs)
    assert llm.generate(ps[:1], SamplingParams(max_tokens=3))[0].logprobs is None
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(ValueError, match="logprobs"):
            SamplingParams(logprobs=bad)
