"""Planning ahead on the planner's thread: same outputs as planning in the step, a plan
that names a sequence aborted since is harmless, and every page comes back."""
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from helpers.spec_checks import run_random_workload
from helpers.prompts import prompts


def test_outputs_equal_serial_planning_and_the_wait_is_timed(llama_dir, draft_dir):
    ps = prompts(10, seed=70)
    params = [SamplingParams(max_tokens=20, temperature=t, seed=i, ignore_eos=True)
              for i, t in enumerate([0.0, 1.0] * 5)]
    spec = SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=3)
    outs = {}
    for flag in (True, False):
        llm = LLM(llama_dir, spec=spec, async_planning=flag, max_num_seqs=4)   # queueing: admissions mid-run
        outs[flag] = [o.token_ids for o in llm.generate(ps, params)]
        waited = llm.stats()["timing"]["wait"]
        assert (waited > 0) == flag
    assert outs[True] == outs[False]


def test_planning_ahead_is_off_on_the_cpu_by_default_and_can_be_turned_on(llama_dir):
    assert not LLM(llama_dir).engine.async_planning
    assert LLM(llama_dir, async_planning=True).engine.async_planning


def test_abort_while_the_next_plan_is_pending(llama_dir):
    llm = LLM(llama_dir, num_pages=40, page_size=4, async_planning=True)
    eng = llm.engine
    ids = [eng.add_request(p, SamplingParams(max_tokens=30, ignore_eos=True)) for p in prompts(3, seed=71)]
    eng.step()
    assert eng._next_plan is not None          # step 2 is being planned already
    eng.abort(ids[1])
    eng.pop_finished(ids[1])
    while eng.has_unfinished():
        eng.step()
    assert eng.planner.num_free_pages == eng.kv_cache.num_pages
    assert all(len(eng.seqs[i].output_ids) == 30 for i in (ids[0], ids[2]))


def test_random_workload_with_preemption_returns_every_page(llama_dir, draft_dir):
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=2),
              num_pages=30, page_size=4, max_num_seqs=8, async_planning=True)
    eng = run_random_workload(llm, seed=72)
    assert eng.planner.num_free_pages == eng.kv_cache.num_pages
    assert eng.finished.totals["num_preemptions"] > 0


def test_outputs_equal_under_preemption_while_drafters_refill(llama_dir, draft_dir, heads):
    """Tight KV memory: plans made during the drafters' refills preempt sequences; greedy
    outputs still equal plain decoding for draft models, MTP chains and EAGLE trees."""
    ps = prompts(12, seed=73)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in LLM(llama_dir).generate(ps, params)]
    for spec in (SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=3),
                 SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=3),
                 SpecConfig(method="eagle_tree", draft=heads["trained"], num_draft_tokens=3, tree_num_nodes=6)):
        llm = LLM(llama_dir, spec=spec, num_pages=34, page_size=4, max_num_seqs=12, async_planning=True)
        assert [o.token_ids for o in llm.generate(ps, params)] == ref
        assert llm.engine.finished.totals["num_preemptions"] > 0
