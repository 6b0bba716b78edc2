"""Adaptive speculation (engine/spec_control.py): a simulated machine where one mode is
faster must end up running mostly that mode, probing the other; in the engine the choice
never changes tokens."""
import pytest

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.engine.spec_control import SpeculationControl


def simulate(spec_tok_s: float, plain_tok_s: float, steps: int = 3000) -> SpeculationControl:
    c = SpeculationControl()
    for _ in range(steps):
        rate = spec_tok_s if c.speculate else plain_tok_s
        tokens = 2 if c.speculate else 1
        c.record(tokens / rate, tokens, measured=True)
    return c


@pytest.mark.parametrize("spec,plain", [(150.0, 100.0), (80.0, 100.0), (60.0, 200.0)])
def test_the_faster_mode_runs_most_steps(spec, plain):
    c = simulate(spec, plain)
    faster = spec > plain
    share = c.steps[faster] / (c.steps[True] + c.steps[False])
    assert share > 0.9, c.steps
    assert c.steps[not faster] > 0   # the other mode is still probed
    assert c.rates[True] == pytest.approx(spec) and c.rates[False] == pytest.approx(plain)


def test_a_change_of_regime_is_followed():
    c = simulate(80.0, 100.0)
    assert not c.winner
    for _ in range(3000):   # speculation becomes the faster mode (say, traffic changed)
        tokens = 2 if c.speculate else 1
        c.record(tokens / (200.0 if c.speculate else 100.0), tokens, measured=True)
    assert c.winner


def test_unmeasured_steps_do_not_move_the_estimates():
    c = SpeculationControl(phase_steps=2, probe_steps=1)
    for _ in range(50):
        c.record(1.0, 1, measured=False)
    assert c.rates == {True: None, False: None} and c.speculate


def test_bad_settings_raise():
    with pytest.raises(ValueError):
        SpeculationControl(phase_steps=0)


def test_adaptive_engine_gives_plain_tokens():
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    prompts = ["def add(a, b):\n    return", "The quick brown fox"]
    ref = [o.token_ids for o in LLM("default").generate(prompts, params)]
    llm = LLM("default", spec=SpecConfig(method="mtp", num_draft_tokens=2), adaptive_speculation=True)
    for _ in range(3):
        assert [o.token_ids for o in llm.generate(prompts, params)] == ref
    s = llm.stats()["adaptive_speculation"]
    assert s["speculating_steps"] > 32 and s["plain_steps"] > 0   # the first phase, then a probe
    assert s["speculating_tok_s"] > 0 and s["plain_tok_s"] > 0
