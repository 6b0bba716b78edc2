"""EAGLE tree speculation in the engine: greedy output equals plain decoding for several
tree shapes and batch sizes, sampled output follows the target law, trees beat chains
on acceptance, pages come back, misfits are refused."""
import pytest

from helpers.mtp_fixtures import random_head, save
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from helpers.spec_checks import check_greedy_with_stops, check_sampled_law, run_random_workload
from helpers.prompts import prompts

SHAPES = {
    "dynamic_k2_n5": dict(num_draft_tokens=3, tree_top_k=2, tree_num_nodes=5),
    "dynamic_k4_n16": dict(num_draft_tokens=4, tree_top_k=4, tree_num_nodes=16),
    "static": dict(num_draft_tokens=3, tree_paths=[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
    "deep_narrow": dict(num_draft_tokens=6, tree_top_k=1, tree_num_nodes=6),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("which", ["random", "trained"])
def test_greedy_equals_plain_decoding(shape, which, llama_dir, heads, plain_greedy):
    ps = prompts(16, seed=60)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = LLM(llama_dir, spec=SpecConfig(method="eagle_tree", draft=heads[which], **SHAPES[shape]))
    for bs in (1, 6, 16):
        assert [o.token_ids for o in llm.generate(ps[:bs], params)] == plain_greedy(ps[:bs], params)
    s = llm.stats()
    assert s["num_draft_tokens"] > 0
    if which == "trained":
        assert s["num_accepted_tokens"] >= 20, s
    assert llm.engine.planner.num_free_pages == llm.engine.kv_cache.num_pages


def test_trees_accept_more_than_chains_of_the_same_depth(llama_dir, heads):
    """Same trained head, same depth: the tree's acceptance length exceeds the chain's
    (the accepted path's KV and hidden states are committed correctly, or it would not)."""
    ps = prompts(8, seed=61)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    taus = {}
    for method, extra in (("mtp", {}), ("eagle_tree", dict(tree_top_k=4, tree_num_nodes=16))):
        llm = LLM(llama_dir, spec=SpecConfig(method=method, draft=heads["trained"], num_draft_tokens=3, **extra))
        for p in ps:   # batch 1: full-size trees
            llm.generate(p, params)
        taus[method] = llm.stats()["acceptance_length"]
    assert taus["eagle_tree"] > taus["mtp"] + 0.1, taus


def test_greedy_equals_transformers_with_stops_and_chunked_prefill(llama_dir, heads):
    llm = LLM(llama_dir, spec=SpecConfig(method="eagle_tree", draft=heads["trained"], num_draft_tokens=3),
              max_num_batched_tokens=7)
    check_greedy_with_stops(llm, llama_dir, prompts(4, seed=41))
    assert llm.stats()["num_accepted_tokens"] >= 5


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.8, 20, 0.9)])
def test_sampled_output_follows_the_target_distribution(llama_dir, heads, temperature, top_k, top_p):
    llm = LLM(llama_dir, spec=SpecConfig(method="eagle_tree", draft=heads["trained"], num_draft_tokens=3,
                                         tree_top_k=3, tree_num_nodes=8), max_num_seqs=256)
    assert check_sampled_law(llm, llama_dir, temperature, top_k, top_p)["num_accepted_tokens"] > 0


def test_tree_size_shrinks_with_the_batch(llama_dir, heads):
    llm = LLM(llama_dir, spec=SpecConfig(method="eagle_tree", draft=heads["random"], num_draft_tokens=3,
                                         tree_num_nodes=24))
    sizes = [llm.engine.proposer.nodes_for_batch(b) for b in (1, 2, 4, 8, 16, 64)]
    assert sizes == [24, 24, 15, 7, 3, 1]


def test_pages_return_after_random_requests_aborts_and_preemption(llama_dir, heads):
    llm = LLM(llama_dir, spec=SpecConfig(method="eagle_tree", draft=heads["trained"], num_draft_tokens=3),
              num_pages=24, page_size=4)
    eng = run_random_workload(llm, seed=63)
    assert eng.planner.num_free_pages == eng.kv_cache.num_pages


@pytest.mark.parametrize("fixture", ["qwen_dir", "mistral_dir"])
def test_biased_and_sliding_window_targets_at_the_context_limit(fixture, request, tmp_path):
    target = request.getfixturevalue(fixture)
    head = save(random_head(target), str(tmp_path / "head"))
    ps = prompts(8, seed=64)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    ref = [o.token_ids for o in LLM(target, max_model_len=40).generate(ps, params)]
    assert any(len(r) < 30 for r in ref)
    llm = LLM(target, spec=SpecConfig(method="eagle_tree", draft=head, num_draft_tokens=3, tree_top_k=3,
                                      tree_num_nodes=10), max_model_len=40)
    assert [o.token_ids for o in llm.generate(ps, params)] == ref


def test_missing_head_is_a_clear_error(qwen_dir):
    with pytest.raises(ValueError, match="method='eagle_tree', draft=DIR"):
        LLM(qwen_dir, spec=SpecConfig(method="eagle_tree"))


def test_paused_speculation_under_load_stays_exact(llama_dir, heads, plain_greedy):
    """spec_max_batch: trees pause while more sequences decode and resume as they finish."""
    ps = prompts(6, seed=65)
    params = [SamplingParams(max_tokens=8 + 4 * i, temperature=0.0, ignore_eos=True) for i in range(6)]
    llm = LLM(llama_dir, spec=SpecConfig(method="eagle_tree", draft=heads["trained"], num_draft_tokens=3),
              spec_max_batch=2)
    got = [o.token_ids for o in llm.generate(ps, params)]
    want = [plain_greedy([p], q)[0] for p, q in zip(ps, params)]
    assert got == want
    assert llm.stats()["num_accepted_tokens"] > 0
