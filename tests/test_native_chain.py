"""Greedy chain drafting in one native call (``ops.DecoderStack.greedy_chain``) against
drafting round by round through the per-round Python path: every proposed chain must be
the same, step after step, for MTP heads (both layouts), draft models (also with a
sliding window and a padded vocabulary) and the packaged models at batch 4."""
import pytest
import torch

import sonarspec_ext.spec.draft_model as draft_model
import sonarspec_ext.spec.mtp as mtp
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.spec.proposer import native_greedy_chains

PROMPTS = [[5, 6, 7], [40, 41, 42, 43, 44, 45, 46, 47, 48], [9] * 5, [100, 101]]
PARAMS = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def _drafts(model, spec, prompts, native: bool, monkeypatch, params=PARAMS):
    """Every step's proposed chains, and the outputs."""
    for mod in (mtp, draft_model):
        monkeypatch.setattr(mod, "native_greedy_chains",
                            native_greedy_chains if native else (lambda *a, **k: None))
    llm = LLM(model, spec=spec)
    proposer, seen, used = llm.engine.proposer, [], []
    real = proposer.propose

    def recording(seqs, ks):
        out = real(seqs, ks)
        seen.append([d.token_ids for d in out])
        return out
    proposer.propose = recording
    if native:
        real_chains = native_greedy_chains

        def counting(*a, **k):
            out = real_chains(*a, **k)
            used.append(out is not None)
            return out
        for mod in (mtp, draft_model):
            monkeypatch.setattr(mod, "native_greedy_chains", counting)
    outs = [o.token_ids for o in llm.generate(prompts, params)]
    return seen, outs, used


@pytest.mark.parametrize("which,k", [("random", 3), ("random_eagle1", 4), ("trained", 2)])
def test_mtp_chains_equal_round_by_round(llama_dir, heads, which, k, monkeypatch):
    spec = SpecConfig(method="mtp", draft=heads[which], num_draft_tokens=k)
    a, out_a, used = _drafts(llama_dir, spec, PROMPTS, True, monkeypatch)
    b, out_b, _ = _drafts(llama_dir, spec, PROMPTS, False, monkeypatch)
    assert any(used), "the native chain never ran"
    assert a == b and out_a == out_b


@pytest.mark.parametrize("fixture", ["draft_dir", "padded_draft_dir", "mistral_dir"])
def test_draft_model_chains_equal_round_by_round(llama_dir, mistral_dir, request, fixture, monkeypatch):
    target = mistral_dir if fixture == "mistral_dir" else llama_dir
    spec = SpecConfig(method="draft_target", draft=request.getfixturevalue(fixture), num_draft_tokens=4)
    a, out_a, used = _drafts(target, spec, PROMPTS, True, monkeypatch)
    b, out_b, _ = _drafts(target, spec, PROMPTS, False, monkeypatch)
    assert any(used), "the native chain never ran"
    assert a == b and out_a == out_b


@pytest.mark.parametrize("method,k", [("mtp", 3), ("draft_target", 4)])
def test_packaged_models_batch_4(method, k, monkeypatch):
    spec = SpecConfig(method=method, num_draft_tokens=k)
    prompts = ["def parse_args(argv):", "import os\n", "class Stack:", "for i in range(10):"]
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    a, out_a, used = _drafts("default", spec, prompts, True, monkeypatch, params)
    b, out_b, _ = _drafts("default", spec, prompts, False, monkeypatch, params)
    assert sum(used) >= 8
    assert a == b and out_a == out_b


def test_greedy_chain_rejects_bad_input():
    llm = LLM("default", spec=SpecConfig(method="draft_target", num_draft_tokens=3))
    runner = llm.engine.proposer.runner
    stack, model = runner.stack(), llm.engine.proposer.model
    embed, lm_head = model.model.embed_tokens.weight, model.lm_head.weight
    table = torch.arange(4).view(1, 4)
    one = torch.tensor([1])
    with pytest.raises(ValueError, match="outside the block table"):
        stack.greedy_chain(embed, lm_head, 100, one, torch.tensor([63]), table, 16, 0, 2)
    with pytest.raises(ValueError, match="tokens must be"):
        stack.greedy_chain(embed, lm_head, 100, one.int(), torch.tensor([3]), table, 16, 0, 2)
    with pytest.raises(ValueError, match="vocab"):
        stack.greedy_chain(embed, lm_head, lm_head.shape[0] + 1, one, torch.tensor([3]), table, 16, 0, 2)
    with pytest.raises(ValueError, match="features go with MTP heads"):
        stack.greedy_chain(embed, lm_head, 100, one, torch.tensor([3]), table, 16, 0, 2,
                           features=torch.zeros(1, model.config.hidden_size))
