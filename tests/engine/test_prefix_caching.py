"""Prefix caching in the engine: a conversation's later turns find their earlier turns' KV
cached - the target's and the drafter's - and everything they produce equals an engine
without the cache: tokens, log-probabilities bit for bit, and for speculation the drafts
themselves (equal accepted counts step for step mean the drafter read the same KV)."""
import random

import pytest

from sonarspec_ext import LLM, SamplingParams, SpecConfig

PS = 4   # tokens per KV page

SPECS = {
    "plain": lambda heads, draft_dir: None,
    "mtp_chain": lambda heads, draft_dir: SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=3),
    "mtp_single_token": lambda heads, draft_dir: SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=1),
    "eagle_tree": lambda heads, draft_dir: SpecConfig(method="eagle_tree", draft=heads["trained"]),
    "draft_target": lambda heads, draft_dir: SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=3),
    "ngram": lambda heads, draft_dir: SpecConfig(method="ngram", num_draft_tokens=3),
}


def _turns(seed, n=4):
    """A conversation's new tokens per turn (a system prompt first)."""
    rng = random.Random(seed)
    return [[rng.randrange(280) for _ in range(rng.randint(20, 45))] for _ in range(n)]


def _converse(llm, turns, params):
    """Each turn's prompt: the previous turn's prompt, its reply and the turn's tokens."""
    outs, history = [], []
    for new in turns:
        out = llm.generate([history + new], params)[0]
        outs.append(out)
        history = history + new + out.token_ids
    return outs


def _record(out):
    keys = ("num_steps", "num_draft_tokens", "num_accepted_tokens", "num_accepted_per_position")
    return out.token_ids, [(e.token_id, e.logprob) for e in out.logprobs], {k: out.stats[k] for k in keys}


@pytest.mark.parametrize("scheme", list(SPECS))
def test_later_turns_reuse_the_kv_and_equal_an_engine_without_it(llama_dir, draft_dir, heads, scheme):
    spec = SPECS[scheme](heads, draft_dir)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=0)
    # small pages: page ends fall between what the drafter's KV and the target's cover
    kw = dict(page_size=PS) if spec is None else dict(page_size=PS, spec=spec)
    cached = LLM(llama_dir, **kw)
    got = _converse(cached, _turns(1), params)
    want = _converse(LLM(llama_dir, enable_prefix_caching=False, **kw), _turns(1), params)
    assert [_record(o) for o in got] == [_record(o) for o in want]
    # turn t + 1 finds turn t's tokens in whole pages: at least its prompt's, at most all but
    # the reply's last token (never run through the target), which plain decoding finds
    hits = [o.stats["num_cached_tokens"] for o in got]
    assert hits[0] == 0 and all(h % PS == 0 for h in hits)
    for h, prev in zip(hits[1:], got):
        prompt, total = len(prev.prompt_token_ids), len(prev.prompt_token_ids) + len(prev.token_ids)
        assert (prompt - 1) // PS * PS <= h <= (total - 1) // PS * PS
        assert spec is not None or h == (total - 1) // PS * PS
    assert all(o.stats["num_cached_tokens"] == 0 for o in want)
    planner = cached.engine.planner
    assert planner.num_cached_pages > 0 and planner.num_free_pages == cached.engine.kv_cache.num_pages


def test_seeded_sampled_turns_equal_an_engine_without_the_cache(llama_dir, heads):
    spec = SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=2)
    params = SamplingParams(max_tokens=16, temperature=0.8, seed=5, ignore_eos=True, logprobs=0)
    got = _converse(LLM(llama_dir, spec=spec, page_size=PS), _turns(2), params)
    want = _converse(LLM(llama_dir, spec=spec, page_size=PS, enable_prefix_caching=False), _turns(2), params)
    assert [_record(o) for o in got] == [_record(o) for o in want]
    assert got[2].stats["num_cached_tokens"] > 0


def test_shared_prompts_under_kv_pressure_equal_an_engine_without_the_cache(llama_dir):
    """Batches of requests sharing system prompts in a small pool: cached pages are held by
    several requests at once, evicted for new ones and preempted requests find theirs again."""
    rng = random.Random(3)
    systems = [[rng.randrange(280) for _ in range(rng.randint(17, 60))] for _ in range(3)]
    prompts = [rng.choice(systems) + [rng.randrange(280) for _ in range(rng.randint(1, 30))] for _ in range(24)]
    params = [SamplingParams(max_tokens=rng.randint(4, 20), temperature=rng.choice([0.0, 0.8]), seed=i,
                             ignore_eos=True) for i in range(24)]
    kw = dict(num_pages=60, page_size=4, max_num_seqs=6)
    llm = LLM(llama_dir, **kw)
    got = [o.token_ids for batch in (slice(0, 8), slice(8, 24)) for o in llm.generate(prompts[batch], params[batch])]
    want = [o.token_ids for o in LLM(llama_dir, enable_prefix_caching=False, **kw).generate(prompts, params)]
    assert got == want
    stats = llm.stats()
    assert stats["num_preemptions"] > 0
    assert llm.engine.planner.num_free_pages == 60


def _kv(engine, pool, seq_id: int, n: int):
    """The K and V a pool holds for a sequence's first ``n`` positions, every layer."""
    slots = pool.slots(engine.planner.page_table(seq_id), list(range(n)))
    return pool.k[:, slots], pool.v[:, slots]


@pytest.mark.parametrize("scheme", ["mtp_chain", "eagle_tree", "draft_target"])
def test_cached_positions_hold_the_kv_each_model_computes_without_the_cache(llama_dir, draft_dir, heads, scheme):
    """Bit for bit, in the target's pool and the drafter's: what a later turn reads for its
    cached positions equals what an engine without the cache computes there."""
    spec = SPECS[scheme](heads, draft_dir)
    engines = [LLM(llama_dir, spec=spec, page_size=PS, enable_prefix_caching=c).engine for c in (True, False)]
    history, checked = [], 0
    for t, new in enumerate(_turns(4, n=5)):
        prompt = history + new
        # odd turns end with a page boundary where the target's KV does (prompt + reply - 1 tokens
        # of the target's, the last step emitting one token), one position past the drafter's
        reply = 12 + ((1 - len(prompt) - 12) % PS if t % 2 else 0)
        params = SamplingParams(max_tokens=reply, temperature=0.0, ignore_eos=True)
        sids = [e.add_request(prompt, params) for e in engines]
        for e, sid in zip(engines, sids):   # prefill, then a step that drafts (deferred refills run)
            while len(e.seqs[sid].output_ids) < 2:
                e.step()
        hits = engines[0].seqs[sids[0]].num_cached_tokens
        for pool in (lambda e: e.kv_cache, lambda e: e.proposer.kv_cache):
            (k0, v0), (k1, v1) = (_kv(e, pool(e), sid, hits) for e, sid in zip(engines, sids))
            assert k0.equal(k1) and v0.equal(v1)
        checked += hits
        outs = []
        for e, sid in zip(engines, sids):
            while e.has_unfinished():
                e.step()
            outs.append(e.pop_finished(sid).output_ids)
        assert outs[0] == outs[1]
        history = prompt + outs[0]
    assert checked > 0


@pytest.mark.parametrize("scheme", ["plain", "mtp_chain", "draft_target"])
def test_a_request_admitted_while_another_runs_finds_its_filled_pages(llama_dir, draft_dir, heads, scheme):
    spec = SPECS[scheme](heads, draft_dir)
    prompt = _turns(9, n=1)[0] + _turns(10, n=1)[0]
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    outs, hits = {}, {}
    for caching in (True, False):
        kw = dict(page_size=PS, enable_prefix_caching=caching, **({} if spec is None else {"spec": spec}))
        e = LLM(llama_dir, **kw).engine
        first = e.add_request(prompt, params)
        for _ in range(6):
            e.step()
        second = e.add_request(prompt + e.seqs[first].output_ids[:4] + [7], params)
        e.step()
        hits[caching] = e.seqs[second].num_cached_tokens
        while e.has_unfinished():
            e.step()
        outs[caching] = [e.pop_finished(s).output_ids for s in (first, second)]
        assert e.planner.num_free_pages == e.kv_cache.num_pages
    assert outs[True] == outs[False]
    assert hits[False] == 0 and hits[True] >= len(prompt) // PS * PS


@pytest.mark.parametrize("chunk, plan_ahead", [(None, False), (37, False), (37, True)],
                         ids=["whole", "chunked", "chunked-planned-ahead"])
@pytest.mark.parametrize("scheme", ["plain", "mtp_chain", "draft_target"])
def test_a_batch_sharing_a_system_prompt_computes_it_once(llama_dir, draft_dir, heads, scheme, chunk, plan_ahead):
    """Requests queued together behind a shared prefix: the first computes it, the others
    wait for its pages instead of computing them again (its prefill chunk by chunk too; with
    each step planned on the planner's thread while the one before finishes) - same tokens
    as without the cache."""
    spec = SPECS[scheme](heads, draft_dir)
    system = _turns(11, n=1)[0] * 2                       # 40-90 shared tokens
    prompts = [system + t for t in _turns(12, n=6)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    kw = dict(page_size=PS, async_planning=plan_ahead, **({} if spec is None else {"spec": spec}),
              **({} if chunk is None else {"max_num_batched_tokens": chunk}))
    got = LLM(llama_dir, **kw).generate(prompts, params)
    want = LLM(llama_dir, enable_prefix_caching=False, **kw).generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    hits = [o.stats["num_cached_tokens"] for o in got]
    # every later request finds the shared pages (a page needs the token after it to match too)
    assert hits[0] == 0 and all(h >= (len(system) - 1) // PS * PS for h in hits[1:])


def test_reset_prefix_cache_forgets_finished_requests(llama_dir):
    llm = LLM(llama_dir, page_size=PS)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompt = _turns(13, n=1)[0]
    first = llm.generate([prompt], params)[0]
    assert llm.generate([prompt], params)[0].stats["num_cached_tokens"] > 0
    assert llm.reset_prefix_cache() > 0 and llm.engine.planner.num_cached_pages == 0
    again = llm.generate([prompt], params)[0]
    assert again.stats["num_cached_tokens"] == 0 and again.token_ids == first.token_ids
    assert LLM(llama_dir, enable_prefix_caching=False).reset_prefix_cache() == 0
