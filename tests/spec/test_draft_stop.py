"""Confidence-stopped chains (SpecConfig.draft_stop_prob): lossless, shorter drafts where the
drafter doubts, the same drafts whichever drafting path runs them."""
import pytest
import torch

import sonarspec_ext.spec.chain_drafter as chain_drafter
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.spec.draft_stop import kept_length, token_probability

from helpers.prompts import prompts

PARAMS = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


def test_kept_length_is_the_prefix_above_the_threshold():
    assert kept_length([0.9, 0.5, 0.5], 0.3) == 2          # products 0.9, 0.45, 0.225
    assert kept_length([0.9, 0.5, 0.5], 0.0) == 3
    assert kept_length([0.1, 1.0], 0.5) == 1                 # at least one token
    assert kept_length([1.0, 1.0, 0.0], 0.5) == 2
    assert kept_length([0.5, 0.5], 0.25) == 2                # equal to the threshold: kept


def test_token_probability_is_the_softmax():
    logits = torch.tensor([2.0, -1.0, 0.5, float("-inf")])
    p = torch.softmax(logits.double(), -1)
    assert token_probability(logits, 0) == pytest.approx(float(p[0]), rel=1e-6)
    assert token_probability(logits, 3) == 0.0
    assert token_probability(torch.tensor([1.0, float("nan")]), 0) == 0.0


def _run(method, stop, k=4):
    llm = LLM("default", spec=SpecConfig(method=method, num_draft_tokens=k, draft_stop_prob=stop))
    outs = llm.generate(prompts(6, seed=3), PARAMS)
    st = llm.stats()
    return [o.token_ids for o in outs], st["num_draft_tokens"] / st["num_steps"], st


@pytest.mark.parametrize("method", ["mtp", "draft_target"])
def test_stopped_chains_are_lossless_and_shorter(method):
    plain = [o.token_ids for o in LLM("default").generate(prompts(6, seed=3), PARAMS)]
    full, full_len, _ = _run(method, 0.0)
    stopped, stopped_len, st = _run(method, 0.5)
    assert full == plain and stopped == plain
    assert 1.0 <= stopped_len < full_len
    assert all(0.0 <= a <= 1.0 for a in st["accepted_per_position"])


@pytest.mark.parametrize("method", ["mtp", "draft_target"])
def test_the_native_and_per_round_paths_stop_alike(method, monkeypatch):
    """The same drafts from the native refill-and-chain call as from the rounds one by one
    in Python (the native paths switched off): equal drafted and accepted counts."""
    native = _run(method, 0.4)
    monkeypatch.setattr(chain_drafter.ChainDrafter, "_refill_chains", lambda self, seqs, ks: None)
    monkeypatch.setattr(chain_drafter, "fused_chains", lambda *a, **k: None)
    per_round = _run(method, 0.4)
    assert native[0] == per_round[0]
    for key in ("num_steps", "num_draft_tokens", "num_accepted_tokens"):
        assert native[2][key] == per_round[2][key], key


def test_bad_thresholds_are_refused():
    for bad in (-0.1, 1.0, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="draft_stop_prob must be a number in"):
            SpecConfig(method="mtp", draft_stop_prob=bad)
