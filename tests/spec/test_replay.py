"""testing.replay.ReplayProposer (the GPU benchmark's controlled-acceptance drafter):
greedy output equal to plain decoding at any acceptance, for chains and trees; the
measured tokens per step match the rate's expectation (statistical bound below)."""
import pytest

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.bench.spec import PROMPTS
from sonarspec_ext.testing.replay import ReplayProposer, expected_tau

PARAMS = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def plain():
    llm = LLM("default")
    outs = llm.generate(PROMPTS[:4], PARAMS)
    return {tuple(o.prompt_token_ids): o.token_ids for o in outs}


def _replay(references, acceptance, k, width=1):
    llm = LLM("default", spec=SpecConfig(method="ngram", num_draft_tokens=k))
    llm.engine.proposer = ReplayProposer(references, acceptance, k, llm.engine.model_config.vocab_size,
                                         tree_width=width, seed=1)
    outs = llm.generate(PROMPTS[:4], PARAMS)
    return {tuple(o.prompt_token_ids): o.token_ids for o in outs}, llm.stats()


@pytest.mark.parametrize("acceptance,k,width", [(1.0, 4, 1), (0.0, 3, 1), (0.7, 3, 1), (0.8, 4, 3)])
def test_output_equals_plain_decoding_and_tau_follows_the_rate(plain, acceptance, k, width):
    got, stats = _replay(plain, acceptance, k, width)
    assert got == plain
    tau, want = stats["acceptance_length"], expected_tau(acceptance, k)
    # 4 x 64 tokens in ~256 / tau steps; the last steps of a request draft fewer tokens (capped
    # by max_tokens), which lowers tau a little: a bound of 10% plus 0.15 holds both effects
    assert want * 0.9 - 0.15 <= tau <= want + 0.15, (tau, want)


def test_bad_rates_are_refused():
    with pytest.raises(ValueError, match="acceptance must be in"):
        ReplayProposer({}, 1.5, 3, 100)
