"""Checks shared by the speculation tests (draft_target, mtp): a random serving
workload, greedy output against transformers with stops, and the sampled-token law."""
import itertools
import random
from unittest import mock

import torch

from helpers.models import hf_load
from sonarspec_ext import SamplingParams
from sonarspec_ext.testing.reference import filter_logits
from helpers.stats import assert_matches


def run_random_workload(llm, seed: int, iterations: int = 120):
    """Adds random requests (greedy and sampled), steps the engine, aborts some, and drains
    it; returns the engine so callers can check that everything was given back."""
    rng = random.Random(seed)
    eng, live = llm.engine, []
    for it in range(iterations):
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
    return eng


def check_greedy_with_stops(llm, model_dir, prompts):
    """Greedy output equals transformers' generate; a stop token or stop string inside an
    accepted chain ends the output exactly there."""
    hf = hf_load(model_dir)
    for p in prompts:
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)[0, len(p):].tolist()
        assert llm.generate(p, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0].token_ids == ref
        stop_tok = ref[6]
        out = llm.generate(p, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True,
                                             stop_token_ids=[stop_tok]))[0]
        assert out.token_ids == ref[:ref.index(stop_tok) + 1] and out.finish_reason == "stop"
        text = llm.tokenizer.decode(ref)
        stop = text[5:7]
        out = llm.generate(p, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=stop))[0]
        assert out.text == text[:text.find(stop)] and out.finish_reason == "stop"


def exact_second_token_law(path, prompt, temperature, top_k, top_p):
    """Marginal distribution of the 2nd generated token under the processed target."""
    hf = hf_load(path)
    with torch.no_grad():
        p1 = filter_logits(hf(torch.tensor([prompt])).logits[0, -1:], temperature, top_k, top_p).softmax(-1)[0]
        support = torch.nonzero(p1 > 0)[:, 0]
        ctx = torch.cat([torch.tensor(prompt).expand(len(support), -1), support[:, None]], 1)
        p2 = filter_logits(hf(ctx).logits[:, -1], temperature, top_k, top_p).softmax(-1)
    return p1.double(), (p1[support, None] * p2).sum(0).double()


def check_sampled_law(llm, model_dir, temperature, top_k, top_p, n=1000, prompt=(5, 17, 42), seeded=False):
    """Chi-square (significance 0.001) of the first two sampled tokens against the exact
    law of the processed target; returns the engine stats. Unseeded requests (rejection
    sampling) get generators seeded 0 .. n - 1 in turn, so the check is repeatable;
    ``seeded`` requests (coupled sampling) get seeds 0 .. n - 1."""
    prompt = list(prompt)
    p1, p2 = exact_second_token_law(model_dir, prompt, temperature, top_k, top_p)
    params = [SamplingParams(max_tokens=4, temperature=temperature, top_k=top_k, top_p=top_p,
                             seed=s if seeded else None, ignore_eos=True) for s in range(n)]
    seeds = itertools.count()
    with mock.patch("sonarspec_ext.engine.request.new_generator",
                    lambda device: torch.Generator(device=device).manual_seed(next(seeds))):
        outs = llm.generate([prompt] * n, params)
    first = torch.bincount(torch.tensor([o.token_ids[0] for o in outs]), minlength=p1.numel())
    second = torch.bincount(torch.tensor([o.token_ids[1] for o in outs]), minlength=p2.numel())
    assert first[p1 == 0].sum() == 0 and second[p2 == 0].sum() == 0
    assert_matches(first, p1, "first token", min_df=3)
    assert_matches(second, p2, "second token (verified)", min_df=3)
    return llm.stats()
