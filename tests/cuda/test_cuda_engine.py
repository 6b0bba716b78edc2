"""The whole engine on a CUDA device (tools/gpu_check.sh runs these on a GPU machine;
skipped elsewhere): every speculation scheme's greedy output equals plain greedy decoding
on the same device in float32, and seeded sampled output too; speculative sampling follows
the processed target's law,
and every page is given back after a random workload with aborts."""
import pytest
import torch

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from helpers.spec_checks import check_sampled_law, run_random_workload

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SCHEMES = {
    "draft_target K=1": dict(method="draft_target", draft="default", num_draft_tokens=1),
    "draft_target K=4": dict(method="draft_target", draft="default", num_draft_tokens=4),
    "ngram K=4": dict(method="ngram", num_draft_tokens=4),
    "mtp K=1": dict(method="mtp", draft="default", num_draft_tokens=1),
    "mtp K=3": dict(method="mtp", draft="default", num_draft_tokens=3),
    "eagle_tree": dict(method="eagle_tree", draft="default", num_draft_tokens=3, tree_top_k=4, tree_num_nodes=12),
}
TEXT = ["def parse_args(argv):\n", "class Stack:\n    def __init__(self):\n", "import os\n", "    for k in d:\n",
        "try:\n    import json\n"]


@pytest.fixture(scope="module")
def plain_cuda():
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = LLM("default", device="cuda", dtype="float32", cuda_graphs=False)   # eager: the others run graphed
    return params, {bs: [o.token_ids for o in llm.generate(TEXT[:bs], params)] for bs in (1, 5)}


@pytest.mark.parametrize("name", list(SCHEMES))
def test_greedy_equals_plain_on_cuda(name, plain_cuda):
    params, ref = plain_cuda
    llm = LLM("default", device="cuda", dtype="float32", spec=SpecConfig(**SCHEMES[name]), cuda_graphs=False)
    for bs in (1, 5):
        assert [o.token_ids for o in llm.generate(TEXT[:bs], params)] == ref[bs], (name, bs)
    s = llm.stats()
    assert s["num_draft_tokens"] > 0 and s["acceptance_length"] > 1.0
    assert llm.engine.planner.num_free_pages == llm.engine.kv_cache.num_pages


@pytest.mark.parametrize("method", ["draft_target", "mtp"])
def test_sampled_law_on_cuda(method, llama_dir, draft_dir, heads):
    draft = draft_dir if method == "draft_target" else heads["trained"]
    llm = LLM(llama_dir, device="cuda", dtype="float32", max_num_seqs=256, draft_sampling=True,
              spec=SpecConfig(method=method, draft=draft, num_draft_tokens=3))
    assert check_sampled_law(llm, llama_dir, 1.0, 30, 0.9)["num_draft_tokens"] > 0


@pytest.mark.parametrize("name", ["mtp K=1", "mtp K=3", "eagle_tree", "draft_target K=4"])
def test_seeded_sampling_equals_plain_on_cuda(name):
    """Seeded requests (coupled sampling, keyed uniforms copied to the device) get plain
    decoding's tokens on the same device in float32."""
    params = [SamplingParams(max_tokens=24, temperature=0.8, top_k=[0, 20][i % 2], seed=i, ignore_eos=True)
              for i in range(len(TEXT))]
    want = [o.token_ids for o in LLM("default", device="cuda", dtype="float32", cuda_graphs=False).generate(TEXT, params)]
    llm = LLM("default", device="cuda", dtype="float32", spec=SpecConfig(**SCHEMES[name]))
    assert [o.token_ids for o in llm.generate(TEXT, params)] == want
    assert llm.stats()["num_draft_tokens"] > 0


def test_random_workload_frees_every_page_on_cuda(llama_dir, draft_dir):
    llm = LLM(llama_dir, device="cuda", spec=SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=3))
    eng = run_random_workload(llm, seed=5, iterations=80)
    assert not eng.has_unfinished() and eng.planner.num_free_pages == eng.kv_cache.num_pages


def test_bfloat16_speculation_mostly_agrees(plain_cuda):
    """bfloat16 GEMMs may round a verification pass differently from a decoding one, so
    token-for-token equality is not required; a scheme that verified wrongly would disagree
    on most tokens, not a few."""
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = LLM("default", device="cuda", dtype="bfloat16")
    ref = [o.token_ids for o in plain.generate(TEXT, params)]
    llm = LLM("default", device="cuda", dtype="bfloat16", spec=SpecConfig(**SCHEMES["draft_target K=4"]))
    got = [o.token_ids for o in llm.generate(TEXT, params)]
    prefix = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(got, ref)]
    assert sum(prefix) >= 0.6 * len(TEXT) * params.max_tokens, prefix


@pytest.mark.parametrize("name", ["draft_target K=4", "ngram K=4", "mtp K=1", "mtp K=3"])
def test_cuda_graphs_keep_greedy_output(name, plain_cuda):
    """Steps replayed as CUDA graphs (keys padded to a bucket and masked) give plain greedy
    decoding's output in float32, and the graphs were captured, not skipped."""
    params, ref = plain_cuda
    llm = LLM("default", device="cuda", dtype="float32", spec=SpecConfig(**SCHEMES[name]), cuda_graphs=True)
    for bs in (1, 5):
        assert [o.token_ids for o in llm.generate(TEXT[:bs], params)] == ref[bs], (name, bs)
    graphs = llm.stats()["cuda_graphs"]
    assert all(g["error"] is None for g in graphs) and graphs[0]["captured"] > 0, graphs
    assert llm.engine.planner.num_free_pages == llm.engine.kv_cache.num_pages


def test_cuda_graph_logits_match_the_eager_forward():
    """One verification step (5 queries over 70 cached keys, padded to 128): graph replay
    against the eager per-op forward on the same inputs, float32."""
    from sonarspec_ext.runtime.metadata import build_metadata
    runner = LLM("default", device="cuda", dtype="float32").engine.runner
    table = list(range(6))
    meta, pos = build_metadata([(0, 70, table)], runner.kv_cache.page_size, "cuda")
    ids = torch.randint(0, 8000, (70,), device="cuda")
    runner.forward(ids, pos, meta, torch.tensor([69], device="cuda"))          # fills the cache
    meta, pos = build_metadata([(70, 5, table)], runner.kv_cache.page_size, "cuda")
    ids, rows = torch.randint(0, 8000, (5,), device="cuda"), torch.arange(5, device="cuda")
    eager = runner.forward(ids, pos, meta, rows)
    runner.use_cuda_graphs()
    for _ in range(3):   # eager at the shape's first use, then a capture, then a replay
        graphed = runner.forward(ids, pos, meta, rows)
        torch.testing.assert_close(graphed, eager, rtol=1e-4, atol=1e-4)
    assert runner.graphs.error is None and len(runner.graphs.graphs) == 1


def test_cuda_graphs_are_the_default_on_cuda():
    llm = LLM("default", device="cuda", dtype="float32", spec=SpecConfig(**SCHEMES["mtp K=3"]))
    assert all(r.graphs is not None for r in llm.engine.runners())
    assert all(r.graphs is None for r in LLM("default", cuda_graphs=False, device="cuda").engine.runners())
