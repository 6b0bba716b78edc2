"""Repetition / frequency / presence penalties and logit bias (``sampling.penalties``):
greedy output against transformers' logits penalized by a formula written here, equal
under every speculation scheme to plain decoding's, the sampled law of the first two
tokens under speculation against the exact penalized law, raw logprobs, bad values."""
import math
from collections import Counter

import pytest
import torch

from helpers.models import VOCAB, hf_load
from helpers.prompts import prompts
from helpers.stats import assert_matches
from sonarspec_ext import LLM, SamplingParams, SpecConfig

CASES = {
    "repetition": dict(repetition_penalty=1.8),
    "frequency_presence": dict(frequency_penalty=1.5, presence_penalty=0.8),
    "negative": dict(presence_penalty=-2.0, repetition_penalty=0.5),
    "bias": dict(logit_bias={7: 100.0, 9: 5.0}, frequency_penalty=2.0),
}


def penalized(logits: torch.Tensor, prompt, output, repetition_penalty=1.0, frequency_penalty=0.0,
              presence_penalty=0.0, logit_bias=None) -> torch.Tensor:
    """The oracle: vLLM's order (repetition over prompt and output, then frequency and
    presence over the output, then the bias), one token at a time."""
    x = logits.double().clone()
    for t in set(prompt) | set(output):
        x[t] = x[t] / repetition_penalty if x[t] > 0 else x[t] * repetition_penalty
    for t, n in Counter(output).items():
        x[t] -= frequency_penalty * n + presence_penalty
    for t, b in (logit_bias or {}).items():
        x[t] += b
    return x


def reference_greedy(hf, prompt, n, **penalties):
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = hf(torch.tensor([prompt + out])).logits[0, -1]
            out.append(int(penalized(logits, prompt, out, **penalties).argmax()))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_penalties_match_transformers(case, llama_dir):
    hf, llm = hf_load(llama_dir), LLM(llama_dir, compact_weights=False)
    ps = prompts(3, seed=70)
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True, **CASES[case])
    outs = llm.generate(ps, params)
    plain = llm.generate(ps, SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True))
    for p, o in zip(ps, outs):
        assert o.token_ids == reference_greedy(hf, p, 14, **CASES[case])
    assert any(a.token_ids != b.token_ids for a, b in zip(outs, plain))   # the penalties did something


@pytest.mark.parametrize("spec", [
    dict(method="ngram", num_draft_tokens=3),
    dict(method="draft_target", num_draft_tokens=3),
    dict(method="mtp", num_draft_tokens=3),
    dict(method="mtp", num_draft_tokens=1),       # the single-token schedule's engine
    dict(method="eagle_tree", num_draft_tokens=3),
], ids=["ngram", "draft_target", "mtp3", "mtp1", "eagle_tree"])
def test_speculative_penalties_equal_plain_decoding(spec, llama_dir, heads):
    draft = {"draft_target": llama_dir, "mtp": heads["trained"], "eagle_tree": heads["trained"]}.get(spec["method"])
    ps = prompts(5, seed=71)
    llm = LLM(llama_dir, spec=SpecConfig(draft=draft, **spec))
    plain = LLM(llama_dir)
    for case in ("repetition", "frequency_presence", "bias"):
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, **CASES[case])
        assert [o.token_ids for o in llm.generate(ps, params)] == [o.token_ids for o in plain.generate(ps, params)]
    assert llm.stats()["num_accepted_tokens"] > 0


def test_sampled_penalties_under_speculation_follow_the_penalized_law(llama_dir):
    """draft_target with the target as its own draft: the drafter penalizes its logits from
    the tokens before the step, the target's rows also count the drafts before them, so
    drafts go through rejections and residuals. The bias puts most of the first token's
    mass on token 9, the penalties most of it back for a repeat. (The greedy tests above
    check that a drafted row's penalties count the drafts before it.)"""
    prompt, n = [9, 9, 9, 9, 17, 9], 1500
    pen = dict(repetition_penalty=1.6, presence_penalty=2.0, frequency_penalty=2.0, logit_bias={9: 8.0})
    hf = hf_load(llama_dir)
    with torch.no_grad():
        p1 = penalized(hf(torch.tensor([prompt])).logits[0, -1], prompt, [], **pen).softmax(-1)
        ctx = torch.cat([torch.tensor(prompt).expand(VOCAB, -1), torch.arange(VOCAB)[:, None]], 1)
        rows = hf(ctx).logits[:, -1]
        p2 = sum(p1[t] * penalized(rows[t], prompt, [t], **pen).softmax(-1) for t in range(VOCAB))
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=llama_dir, num_draft_tokens=3))
    outs = llm.generate([prompt] * n, [SamplingParams(max_tokens=4, temperature=1.0, seed=s, ignore_eos=True, **pen)
                                       for s in range(n)])
    first = torch.bincount(torch.tensor([o.token_ids[0] for o in outs]), minlength=VOCAB)
    second = torch.bincount(torch.tensor([o.token_ids[1] for o in outs]), minlength=VOCAB)
    assert_matches(first, p1, "first token")
    assert_matches(second, p2, "second token (verified)", min_df=3)
    s = llm.stats()
    assert 0 < s["num_accepted_tokens"] < s["num_draft_tokens"]   # drafts kept and rejected


def test_logprobs_stay_those_of_the_raw_distribution(llama_dir):
    hf, llm = hf_load(llama_dir), LLM(llama_dir, compact_weights=False, spec=SpecConfig(method="ngram"))
    p = prompts(1, seed=72)[0]
    out = llm.generate([p], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=2,
                                           **CASES["frequency_presence"]))[0]
    with torch.no_grad():
        logp = torch.log_softmax(hf(torch.tensor([p + out.token_ids])).logits[0].double(), -1)
    for i, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs)):
        assert math.isclose(entry.logprob, logp[len(p) - 1 + i, tok].item(), abs_tol=2e-4)


@pytest.mark.parametrize("bad", [dict(repetition_penalty=0), dict(repetition_penalty=float("nan")),
                                 dict(frequency_penalty=2.5), dict(presence_penalty=-3), dict(presence_penalty="1"),
                                 dict(logit_bias={1: 101}), dict(logit_bias={-1: 1.0}), dict(logit_bias=[1])])
def test_bad_penalties_raise(bad):
    with pytest.raises(ValueError, match="penalty|logit_bias"):
        SamplingParams(**bad)


def test_a_bias_outside_the_vocabulary_fails_that_request_only(llama_dir):
    llm = LLM(llama_dir)
    with pytest.raises(ValueError, match="logit_bias token id"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, logit_bias={VOCAB: 1.0}))
    assert len(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))[0].token_ids) == 4


@pytest.mark.parametrize("spec", [dict(method=m, num_draft_tokens=3) for m in ("draft_target", "mtp", "eagle_tree")],
                         ids=["draft_target", "mtp", "eagle_tree"])
def test_drafters_do_not_propose_a_banned_token(spec, llama_dir, heads):
    """A -100 logit bias bans a token: the drafters apply it to their own logits too, so
    the token drafted most without the bias is not drafted with it."""
    from collections import Counter
    draft = {"draft_target": llama_dir, "mtp": heads["trained"], "eagle_tree": heads["trained"]}[spec["method"]]
    llm = LLM(llama_dir, spec=SpecConfig(draft=draft, **spec))
    drafted = []
    real = llm.engine.proposer.propose

    def recording(seqs, ks):
        out = real(seqs, ks)
        drafted.extend(t for d in out for t in d.token_ids)
        return out
    llm.engine.proposer.propose = recording
    ps = prompts(4, seed=73)
    llm.generate(ps, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    banned, n = Counter(drafted).most_common(1)[0]
    assert n >= 5
    drafted.clear()
    llm.generate(ps, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logit_bias={banned: -100.0}))
    assert drafted and banned not in drafted
