"""Draft-target and n-gram speculation: lossless greedy and sampled output, stats, errors."""
import json
import shutil

import pytest

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from helpers.spec_checks import check_greedy_with_stops, check_sampled_law, run_random_workload
from helpers.prompts import prompts


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


def test_greedy_equals_transformers_with_stops(llama_dir):
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=llama_dir, num_draft_tokens=4))
    check_greedy_with_stops(llm, llama_dir, prompts(4, seed=21))


def test_ngram_greedy_equals_plain(llama_dir, plain_greedy):
    ps = [p * 3 for p in prompts(8, seed=5)]  # repetitive prompts give the lookup something to find
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = LLM(llama_dir, spec=SpecConfig(method="ngram", num_draft_tokens=3))
    assert [o.token_ids for o in llm.generate(ps, params)] == plain_greedy(ps, params)
    assert llm.stats()["num_draft_tokens"] > 0


@pytest.mark.parametrize("temperature,top_k,top_p,draft_sampling", [
    (1.0, 0, 1.0, False), (0.7, 0, 1.0, True), (1.3, 0, 1.0, False), (1.0, 30, 0.9, True)])
def test_sampled_output_follows_the_target_distribution(llama_dir, draft_dir, temperature, top_k, top_p,
                                                        draft_sampling):
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=3),
              max_num_seqs=256, draft_sampling=draft_sampling)
    assert check_sampled_law(llm, llama_dir, temperature, top_k, top_p)["num_draft_tokens"] > 0


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


def test_pages_return_after_random_requests_aborts_and_preemption(llama_dir, draft_dir):
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=4),
              page_size=4, num_pages=48, max_num_seqs=8)
    eng = run_random_workload(llm, seed=3)
    assert eng.planner.num_free_pages == 48 and not eng.proposer.state and not eng.proposer.waiting
    assert eng.finished.totals["num_preemptions"] > 0


def test_steps_speculated_and_paused_are_counted(llama_dir, draft_dir):
    """Engine.decode_steps (the server's sonarspec_spec_engine_steps) counts the steps that
    drafted and those spec_max_batch=2 ran plainly: checked against the number of decoding
    requests at each step (those already holding an output token), recorded by the proposer."""
    from sonarspec_ext.server.metrics import Metrics
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=3),
              spec_max_batch=2)
    eng, seen = llm.engine, []
    real = eng.proposer.propose

    def propose(seqs, ks):
        seen.append((sum(1 for s in eng.seqs.values() if not s.finished and s.output_ids), len(seqs)))
        return real(seqs, ks)
    eng.proposer.propose = propose
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (6, 10, 14, 30)]
    llm.generate(prompts(4, seed=71), params)
    paused = sum(1 for decoding, _ in seen if decoding > 2)
    drafted = sum(1 for decoding, n in seen if decoding <= 2 and n > 0)
    assert paused > 5 and drafted > 5 and eng.decode_steps == {"speculating": drafted, "paused": paused}
    metrics = Metrics()
    metrics.watch(eng, lambda: 0, llm.memory())
    for _ in range(2):   # read at each scrape, never added twice
        text = metrics.render().decode()
        assert f'sonarspec_spec_engine_steps_total{{kind="paused"}} {float(paused)}' in text
        assert f'sonarspec_spec_engine_steps_total{{kind="speculating"}} {float(drafted)}' in text
        assert f"sonarspec_kv_pages_in_use {float(eng.kv_cache.num_pages - eng.planner.num_free_pages)}" in text


def _record_proposals(llm):
    """Wraps the proposer: returns a list that collects (seq_id, num_tokens, draft ids)."""
    log, real = [], llm.engine.proposer.propose

    def propose(seqs, ks):
        drafts = real(seqs, ks)
        log.extend((s.seq_id, s.num_tokens, d.token_ids) for s, d in zip(seqs, drafts))
        return drafts
    llm.engine.proposer.propose = propose
    return log


@pytest.mark.parametrize("method", ["draft_target", "mtp"])
def test_speculation_pauses_under_load_and_resumes_losslessly(method, llama_dir, draft_dir, plain_greedy, tmp_path):
    """spec_max_batch=2: while more sequences decode the steps run plain and the drafter
    defers its refill; as requests finish, speculation resumes after a catch-up that
    leaves the drafter exactly where an unpaused one would be (same drafts)."""
    from helpers.mtp_fixtures import random_head, save
    draft = draft_dir if method == "draft_target" else save(random_head(llama_dir), str(tmp_path / "head"))
    spec = SpecConfig(method=method, draft=draft, num_draft_tokens=3)
    ps = prompts(6, seed=70)
    lens = [6, 10, 14, 30, 40, 50]   # requests finish one after another: the batch shrinks
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lens]
    llm = LLM(llama_dir, spec=spec, spec_max_batch=2)
    log = _record_proposals(llm)
    got = [o.token_ids for o in llm.generate(ps, params)]
    assert got == [plain_greedy([p], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))[0]
                   for p, n in zip(ps, lens)]
    eng = llm.engine
    assert eng.planner.num_free_pages == eng.kv_cache.num_pages and not eng.proposer.state and not eng.proposer.waiting
    last = {n: d for sid, n, d in log if sid == 5}   # the longest request, drafted only after resuming
    assert last and min(last) > len(ps[5]) + 14   # it decoded paused first
    alone = LLM(llama_dir, spec=spec)
    alone_log = _record_proposals(alone)
    alone.generate([ps[5]], params[5])
    ref = {n: d for _, n, d in alone_log}
    assert all(last[n] == ref[n] for n in last)
    with pytest.raises(ValueError, match="spec_max_batch"):
        LLM(llama_dir, spec_max_batch=-1)


def test_a_prompt_prefilled_under_load_is_drafted_for_after_the_catch_up(llama_dir, plain_greedy, tmp_path):
    """spec_max_batch=1: prompts prefilled in a paused step - two together (a step that only
    prefills is judged by the sequences it prefills), then one arriving while they decode -
    have the MTP head's run over them deferred with the decoded tokens'; once the late one
    decodes alone, the catch-up runs the head over prompt and tokens at once, leaving the
    drafts those of the request run alone."""
    from helpers.mtp_fixtures import random_head, save
    spec = SpecConfig(method="mtp", draft=save(random_head(llama_dir), str(tmp_path / "head")), num_draft_tokens=3)
    first, late = prompts(2, seed=72), prompts(1, seed=73)[0]
    llm = LLM(llama_dir, spec=spec, spec_max_batch=1)
    eng, log = llm.engine, _record_proposals(llm)
    short = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    ids = [eng.add_request(p, short) for p in first]
    eng.step()   # prefill only, of two prompts that decode next: paused too, the head deferred
    assert all(eng.proposer.state[i].pending_rows == len(p) for i, p in zip(ids, first))
    for _ in range(2):
        eng.step()
    sid = eng.add_request(late, long)
    eng.step()   # the late prompt's prefill, beside two decoding sequences: a paused step
    st = eng.proposer.state[sid]
    assert st.pending_rows == len(late) and st.valid == 0 and st.logits is None
    while eng.has_unfinished():
        eng.step()
    assert [eng.seqs[i].output_ids for i in ids] == plain_greedy(first, short)
    assert eng.seqs[sid].output_ids == plain_greedy([late], long)[0]
    mine = {n: d for s, n, d in log if s == sid}
    assert mine   # it speculated once alone
    alone = LLM(llama_dir, spec=spec)
    alone_log = _record_proposals(alone)
    alone.generate([late], long)
    ref = {n: d for _, n, d in alone_log}
    assert all(mine[n] == ref[n] for n in mine)
