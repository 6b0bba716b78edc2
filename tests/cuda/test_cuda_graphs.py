"""``engine.cuda_graphs``: the static-buffer forward that CUDA graphs capture, run eagerly
on the CPU (``StepGraphs(capture=False)``): outputs equal the engine's own per-op path for
plain decoding, draft_target and MTP at batch 1 and 5, across key buckets; the graph
table's limit, the fallback after a failed capture, and the engine option's errors."""
import pytest

import sonarspec_ext.runtime.cuda_graphs as cg
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.bench.spec import PROMPTS

SPECS = {"plain": SpecConfig(), "draft_target": SpecConfig(method="draft_target", draft="default", num_draft_tokens=4),
         "mtp": SpecConfig(method="mtp", draft="default", num_draft_tokens=3)}
PARAMS = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)   # contexts cross the 64-key bucket


def _graphed(spec, capture=False):
    llm = LLM("default", spec=spec)
    for runner in llm.engine.runners():
        runner.use_cuda_graphs(capture=capture)
    return llm


def test_key_buckets():
    assert [cg.key_bucket(n) for n in (0, 1, 64, 65, 128, 129, 1000)] == [64, 64, 64, 128, 128, 256, 1024]


@pytest.mark.parametrize("name", list(SPECS))
def test_static_buffer_forward_equals_the_per_op_path(name):
    ref = LLM("default", spec=SPECS[name])
    llm = _graphed(SPECS[name])
    for bs in (1, 5):
        assert [o.token_ids for o in llm.generate(PROMPTS[:bs], PARAMS)] == \
            [o.token_ids for o in ref.generate(PROMPTS[:bs], PARAMS)]
    shapes = [set(r.graphs.graphs) for r in llm.engine.runners()]
    assert all(shapes) and {s[2] for s in shapes[0]} >= {64, 128}
    # the batch-1 prefill's shape was used once: seen, and left to the eager path
    assert max(s[1] for s in llm.engine.runner.graphs.seen) > 5 >= max(s[1] for s in shapes[0])
    if name != "plain":   # verification (1 + K queries) and single-token draft rounds
        assert {(1, 1 + SPECS[name].num_draft_tokens)} <= {s[:2] for s in shapes[0]}
        assert (1, 1) in {s[:2] for s in shapes[1]}
    assert llm.stats()["acceptance_length"] == ref.stats()["acceptance_length"]
    assert llm.engine.planner.num_free_pages == llm.engine.kv_cache.num_pages


def test_shapes_past_the_limit_and_failed_captures_run_eagerly(monkeypatch):
    ref = [o.token_ids for o in LLM("default").generate(PROMPTS[:3], PARAMS)]
    monkeypatch.setattr(cg, "MAX_GRAPHS", 1)
    llm = _graphed(SPECS["plain"])
    assert [o.token_ids for o in llm.generate(PROMPTS[:3], PARAMS)] == ref
    assert len(llm.engine.runner.graphs.graphs) == 1

    def broken(self, pool):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(cg._Graph, "capture", broken)
    llm = _graphed(SPECS["plain"], capture=True)
    assert [o.token_ids for o in llm.generate(PROMPTS[:3], PARAMS)] == ref
    g = llm.engine.runner.graphs
    assert g.graphs == {} and g.error == "RuntimeError: operation not permitted when stream is capturing"


def test_steps_past_the_token_limit_run_eagerly():
    """``cuda_graph_max_tokens``: 5-sequence decoding steps (5 tokens) past a limit of 4
    stay eager; once requests finish, the 1- to 4-token steps are graphed; outputs
    unchanged."""
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (60, 50, 40, 30, 20)]
    ref = [o.token_ids for o in LLM("default").generate(PROMPTS[:5], params)]
    llm = LLM("default")
    llm.engine.runner.use_cuda_graphs(capture=False, max_tokens=4)
    assert [o.token_ids for o in llm.generate(PROMPTS[:5], params)] == ref
    shapes = set(llm.engine.runner.graphs.graphs)
    assert shapes and all(b * q <= 4 for b, q, *_ in shapes)
    with pytest.raises(ValueError, match="cuda_graph_max_tokens must be a positive integer"):
        LLM("default", cuda_graph_max_tokens=0)


def test_the_option_needs_cuda():
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device"):
        LLM("default", cuda_graphs=True)
    assert LLM("default").engine.runner.graphs is None   # the default: graphs on CUDA devices only


def test_static_buffer_forward_with_key_lists(monkeypatch):
    """The attention kernel's per-token key lists in the graphs' static buffers (the CUDA
    path; run here through the CPU kernel): block tables padded to the key bucket."""
    from sonarspec_ext.runtime.runner import ModelRunner
    ref = LLM("default", spec=SPECS["mtp"])
    want = [o.token_ids for o in ref.generate(PROMPTS[:3], PARAMS)]
    monkeypatch.setattr(ModelRunner, "native_attention", property(lambda self: True))
    llm = _graphed(SPECS["mtp"])
    assert [o.token_ids for o in llm.generate(PROMPTS[:3], PARAMS)] == want
    shapes = set(llm.engine.runner.graphs.graphs)
    assert shapes and all(s[-1] == 3 for s in shapes) and {s[2] for s in shapes} >= {64, 128}
