"""Greedy draft chains kept on the device (``spec.device_chain``, the path of drafters on
CUDA), run here on the CPU with the native chain switched off: output equal to plain
decoding, the same drafts as drafting one forward at a time (the target drafting for
itself has every draft accepted; another draft or an MTP head has the same acceptance
counts), for batches of unequal lengths and a sliding-window model."""
import pytest

import sonarspec_ext.spec.chains as chains_mod
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from helpers.prompts import prompts


def _run(model, draft, ps, params, k, monkeypatch, device_chain, method="draft_target"):
    monkeypatch.setattr(chains_mod, "native_chains", lambda *a, **kw: None)
    calls = []
    real = chains_mod.device_chains
    monkeypatch.setattr(chains_mod, "device_chains", lambda *a: calls.append(a[2]) or real(*a))
    llm = LLM(model, spec=SpecConfig(method=method, draft=draft, num_draft_tokens=k))
    llm.engine.proposer.device_chain = device_chain
    try:
        out = [o.token_ids for o in llm.generate(ps, params)]
    finally:
        monkeypatch.undo()
    assert llm.engine.planner.num_free_pages == llm.engine.kv_cache.num_pages
    assert bool(calls) == device_chain
    return out, llm.stats(), calls


@pytest.mark.parametrize("k", [2, 4])
def test_device_chain_drafts_what_the_target_would(k, llama_dir, plain_greedy, monkeypatch):
    ps = prompts(6, seed=40 + k)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    out, stats, calls = _run(llama_dir, llama_dir, ps, params, k, monkeypatch, True)
    assert out == plain_greedy(ps, params) and max(calls) == k   # shorter chains near max_tokens
    assert stats["accepted_per_position"] == [1.0] * k


@pytest.mark.parametrize("model", ["llama_dir", "mistral_dir"])
def test_device_chain_equals_one_forward_at_a_time(model, draft_dir, monkeypatch, request):
    target = request.getfixturevalue(model)
    ps = prompts(5, seed=3)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = [o.token_ids for o in LLM(target).generate(ps, params)]
    draft = target if model == "mistral_dir" else draft_dir   # a sliding-window drafter
    chained, s1, calls = _run(target, draft, ps, params, 3, monkeypatch, True)
    stepped, s2, _ = _run(target, draft, ps, params, 3, monkeypatch, False)
    assert chained == stepped == plain and calls
    assert (s1["num_draft_tokens"], s1["accepted_per_position"]) == (s2["num_draft_tokens"], s2["accepted_per_position"])


def test_device_chain_of_an_mtp_head_equals_one_forward_at_a_time(llama_dir, heads, plain_greedy, monkeypatch):
    ps = prompts(5, seed=8)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    chained, s1, calls = _run(llama_dir, heads["trained"], ps, params, 3, monkeypatch, True, "mtp")
    stepped, s2, _ = _run(llama_dir, heads["trained"], ps, params, 3, monkeypatch, False, "mtp")
    assert chained == stepped == plain_greedy(ps, params) and max(calls) == 3
    assert s1["num_accepted_tokens"] > 0
    assert (s1["num_draft_tokens"], s1["accepted_per_position"]) == (s2["num_draft_tokens"], s2["accepted_per_position"])
