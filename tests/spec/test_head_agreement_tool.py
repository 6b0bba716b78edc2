"""tools/head_agreement.py: the engine's chains replayed on teacher-forced head predictions
(features from the training feature pass) draft and accept what the engine itself drafted and
accepted, position by position, on the packaged target and head."""
import pytest

from helpers.tools import import_tool
from sonarspec_ext import LLM, SamplingParams, SpecConfig


@pytest.fixture(scope="module")
def tool():
    return import_tool("head_agreement")


def test_replayed_chains_match_the_engines_drafts(tool):
    llm = LLM("default", spec=SpecConfig(method="mtp", num_draft_tokens=2), adaptive_speculation=False,
              enable_prefix_caching=False)
    prompts = ["def fib(n):", "The history of the city", "import os\nimport sys\n", "class Stack:",
               "Once upon a time", "for i in range(10):"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=48, temperature=0.0))
    engine = {"drafted": [0, 0], "accepted": [0, 0]}
    replay = {"drafted": [0, 0], "accepted": [0, 0]}
    for out in outs:
        seq = {"ids": list(out.prompt_token_ids) + list(out.token_ids), "prompt": len(out.prompt_token_ids)}
        counts = tool.teacher_forced(llm.engine.model, llm.engine.proposer.head, seq)
        assert counts["rows"] == len(out.token_ids) - 1
        assert 0 <= counts["top1"] <= counts["top2"] <= counts["top4"] <= counts["rows"]
        for k in range(2):
            engine["drafted"][k] += out.stats["drafted_per_position"][k]
            engine["accepted"][k] += out.stats["num_accepted_per_position"][k]
            replay["drafted"][k] += counts[f"drafted{k + 1}"]
            replay["accepted"][k] += counts[f"accepted{k + 1}"]
    assert sum(engine["accepted"]) > 0
    # the prefill features may differ from the decode steps' in the last bits: a near-tie
    # flipped moves a count by one
    for key in engine:
        for k in range(2):
            assert abs(engine[key][k] - replay[key][k]) <= 2, (key, k, engine, replay)
