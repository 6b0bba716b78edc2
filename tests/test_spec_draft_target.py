"""Draft-target and n-gram speculation: lossless greedy and sampled output, stats, errors."""
import json
import os
import random
import shutil

import pytest
import torch

from conftest import hf_load
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.engine.sampler import filter_logits
from stats import assert_matches
from test_generate import prompts


@pytest.fixture(scope="module")
def plain_greedy(llama_dir):
    llm = LLM(llama_dir)
    cache = {}

    def run(ps, params):
        key = (json.dumps(ps), repr(params))
        if key not in cache:
            cache[key] = [o.token_ids for o in llm.generate(ps, params)]
        return cache[key]
    return run


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("draft", ["draft_dir", "llama_dir"])
def test_greedy_equals_plain_decoding(k, draft, llama_dir, plain_greedy, request):
    ps = prompts(16, seed=k)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=request.getfixturevalue(draft),
                                         num_draft_tokens=k))
    for bs in (1, 5, 16):
        out = llm.generate(ps[:bs], params)
        assert [o.token_ids for o in out] == plain_greedy(ps[:bs], params)
    s = llm.stats()
    assert s["num_draft_tokens"] > 0 and len(s["accepted_per_position"]) == k
    if draft == "llama_dir":  # the target drafting for itself: every greedy draft is accepted
        assert s["accepted_per_position"] == [1.0] * k
        assert s["acceptance_length"] > 1 + 0.6 * k
    assert llm.engine.planner.num_free_pages == llm.engine.kv_cache.num_pages


def test_greedy_equals_transformers_with_stops(llama_dir, draft_dir):
    hf = hf_load(llama_dir)
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=llama_dir, num_draft_tokens=4))
    for p in prompts(4, seed=21):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)[0, len(p):].tolist()
        assert llm.generate(p, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0].token_ids == ref
        # a stop token inside an accepted chain ends the output exactly there
        stop_tok = ref[6]
        out = llm.generate(p, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True,
                                             stop_token_ids=[stop_tok]))[0]
        assert out.token_ids == ref[:ref.index(stop_tok) + 1] and out.finish_reason == "stop"
        text = llm.tokenizer.decode(ref)
        stop = text[5:7]
        out = llm.generate(p, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=stop))[0]
        assert out.text == text[:text.find(stop)] and out.finish_reason == "stop"


def test_ngram_greedy_equals_plain(llama_dir, plain_greedy):
    ps = [p * 3 for p in prompts(8, seed=5)]  # repetitive prompts give the lookup something to find
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = LLM(llama_dir, spec=SpecConfig(method="ngram", num_draft_tokens=3))
    assert [o.token_ids for o in llm.generate(ps, params)] == plain_greedy(ps, params)
    assert llm.stats()["num_draft_tokens"] > 0


def exact_second_token_law(path, prompt, temperature, top_k, top_p):
    """Marginal distribution of the 2nd generated token under the processed target."""
    hf = hf_load(path)
    with torch.no_grad():
        p1 = filter_logits(hf(torch.tensor([prompt])).logits[0, -1:], temperature, top_k, top_p).softmax(-1)[0]
        support = torch.nonzero(p1 > 0)[:, 0]
        ctx = torch.cat([torch.tensor(prompt).expand(len(support), -1), support[:, None]], 1)
        p2 = filter_logits(hf(ctx).logits[:, -1], temperature, top_k, top_p).softmax(-1)
    return p1.double(), (p1[support, None] * p2).sum(0).double()


@pytest.mark.parametrize("temperature,top_k,top_p,draft_sampling", [
    (1.0, 0, 1.0, False), (0.7, 0, 1.0, True), (1.3, 0, 1.0, False), (1.0, 30, 0.9, True)])
def test_sampled_output_follows_the_target_distribution(llama_dir, draft_dir, temperature, top_k, top_p,
                                                        draft_sampling):
    prompt, n = [5, 17, 42], 1000
    p1, p2 = exact_second_token_law(llama_dir, prompt, temperature, top_k, top_p)
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=3),
              max_num_seqs=256, draft_sampling=draft_sampling)
    outs = llm.generate([prompt] * n, [SamplingParams(max_tokens=4, temperature=temperature, top_k=top_k,
                                                      top_p=top_p, seed=s, ignore_eos=True) for s in range(n)])
    assert llm.stats()["num_draft_tokens"] > 0
    first = torch.bincount(torch.tensor([o.token_ids[0] for o in outs]), minlength=p1.numel())
    second = torch.bincount(torch.tensor([o.token_ids[1] for o in outs]), minlength=p2.numel())
    assert first[p1 == 0].sum() == 0 and second[p2 == 0].sum() == 0
    assert_matches(first, p1, "first token", min_df=3)
    assert_matches(second, p2, "second token (verified)", min_df=3)


def test_seeded_speculative_sampling_is_batch_independent(llama_dir, draft_dir):
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=3))
    p = SamplingParams(max_tokens=15, temperature=0.9, seed=77, ignore_eos=True)
    alone = llm.generate([[9, 8, 7]], p)[0].token_ids
    mixed = llm.generate([[1] * 20, [9, 8, 7], [4, 4]],
                         [SamplingParams(max_tokens=9, temperature=1.0, seed=1), p, SamplingParams(max_tokens=30)])
    assert mixed[1].token_ids == alone


def test_padded_draft_vocab_is_tolerated_and_mismatched_tokenizer_rejected(llama_dir, padded_draft_dir, tmp_path,
                                                                           plain_greedy):
    ps = prompts(3, seed=9)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=padded_draft_dir, num_draft_tokens=3))
    assert [o.token_ids for o in llm.generate(ps, params)] == plain_greedy(ps, params)
    other = tmp_path / "other_tok"
    shutil.copytree(padded_draft_dir, other)
    tok = json.load(open(other / "tokenizer.json"))
    tok["added_tokens"][0]["content"] = "<|other|>"
    json.dump(tok, open(other / "tokenizer.json", "w"))
    with pytest.raises(ValueError, match="draft tokenizer .* differs"):
        LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=str(other)))
    with pytest.raises(ValueError, match="not available"):
        LLM(llama_dir, spec=SpecConfig(method="eagle_tree"))


def test_pages_return_after_random_requests_aborts_and_preemption(llama_dir, draft_dir):
    rng = random.Random(3)
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=4),
              page_size=4, num_pages=60, max_num_seqs=8)
    eng = llm.engine
    live = []
    for it in range(120):
        if rng.random() < 0.5:
            p = [rng.randrange(256) for _ in range(rng.randint(1, 40))]
            live.append(eng.add_request(p, SamplingParams(max_tokens=rng.randint(1, 30),
                                                          temperature=rng.choice([0.0, 1.0]), seed=it)))
        eng.step()
        if live and rng.random() < 0.1:
            eng.abort(rng.choice(live))
        for sid in [s for s in live if eng.seqs[s].finished]:
            live.remove(sid)
            eng.pop_finished(sid)
    while eng.has_unfinished():
        eng.step()
    assert eng.planner.num_free_pages == 60 and not eng.proposer.state
    assert sum(s["num_preemptions"] for s in eng.finished_stats) > 0
