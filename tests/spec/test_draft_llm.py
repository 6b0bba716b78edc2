"""Draft models that share their target's embedding and propose from a draft vocabulary
(``models.draft_llm``): what loads is the target's embedding by reference and its
lm_head rows, logits equal a torch reference, speculation stays lossless with every
proposal inside the draft vocabulary, native chains equal the per-op path, and bad
checkpoints are refused with clear errors."""
import json
import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.models.config import CheckpointError
from sonarspec_ext.models.draft_llm import load_draft_model, save_draft_model
from sonarspec_ext.models.loader import load_model
from helpers.drafting import shared_draft_model
from helpers.spec_checks import check_sampled_law
from helpers.prompts import prompts

VOCAB = torch.arange(1, 256, 3)   # every third byte token


def _shared_draft(target_dir: str, path: str, vocab=VOCAB, seed: int = 0) -> str:
    return shared_draft_model(target_dir, path, vocab, seed)


@pytest.fixture(scope="module")
def shared_draft(llama_dir, tmp_path_factory):
    return _shared_draft(llama_dir, str(tmp_path_factory.mktemp("shared_draft")))


def test_loads_the_targets_embedding_and_lm_head_rows_and_matches_a_torch_reference(llama_dir, shared_draft):
    target = load_model(llama_dir, compact_weights=False)
    draft = load_draft_model(shared_draft, target)
    assert draft.model.embed_tokens.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    assert torch.equal(draft.draft_vocab, VOCAB)
    assert torch.equal(draft.lm_head.weight.float(), target.lm_head.weight.float()[VOCAB])
    h = torch.randn(5, target.config.hidden_size)
    logits = draft.compute_logits(h)
    ref = torch.full((5, target.config.vocab_size), float("-inf"))
    ref[:, VOCAB] = F.linear(h, target.lm_head.weight.float()[VOCAB])
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5)
    saved = json.load(open(os.path.join(shared_draft, "config.json")))
    assert saved["shared_embedding"] == "target" and saved["draft_vocab_size"] == VOCAB.numel()


@pytest.mark.parametrize("k", [1, 3])
def test_speculation_is_lossless_and_proposes_only_the_draft_vocabulary(llama_dir, shared_draft, plain_greedy, k):
    ps = prompts(6, seed=70)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=shared_draft, num_draft_tokens=k))
    proposed, real = [], llm.engine.proposer.propose
    llm.engine.proposer.propose = lambda seqs, ks: [proposed.extend(d.token_ids) or d for d in real(seqs, ks)]
    assert [o.token_ids for o in llm.generate(ps, params)] == plain_greedy(ps, params)
    allowed = set(VOCAB.tolist())
    assert proposed and all(t in allowed for t in proposed)


def test_sampled_drafts_from_a_draft_vocabulary_keep_the_target_law(llama_dir, shared_draft):
    """Drafts drawn from the draft's distribution over its vocabulary (native chains give
    it per lm_head row, scattered to token ids): the first two sampled tokens follow the
    exact law of the target (chi-square, significance 0.001)."""
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=shared_draft, num_draft_tokens=3),
              draft_sampling=True)
    assert check_sampled_law(llm, llama_dir, 0.9, 0, 1.0)["num_accepted_tokens"] > 0


def test_bad_draft_checkpoints_are_refused(llama_dir, draft_dir, shared_draft, tmp_path):
    target = load_model(llama_dir)
    bad = str(tmp_path / "bad")
    shutil.copytree(shared_draft, bad)
    cfg_path = os.path.join(bad, "config.json")
    cfg = json.load(open(cfg_path))
    json.dump({**cfg, "shared_embedding": "elsewhere"}, open(cfg_path, "w"))
    with pytest.raises(CheckpointError, match="shared_embedding"):
        load_draft_model(bad, target)
    narrow = _shared_draft(draft_dir, str(tmp_path / "narrow"), seed=1)   # hidden 32, the target's is wider
    with pytest.raises(CheckpointError, match="hidden size"):
        load_draft_model(narrow, target)
    with pytest.raises(ValueError, match="ascending"):
        save_draft_model(load_draft_model(shared_draft, target), str(tmp_path / "x"), torch.tensor([5, 3]))
    out_of_range = _shared_draft(llama_dir, str(tmp_path / "oor"), vocab=torch.tensor([1, 2, 10_000]))
    with pytest.raises(CheckpointError, match="draft vocabulary ids"):
        load_draft_model(out_of_range, target)
    with pytest.raises(CheckpointError, match="shared embedding"):   # a shared draft must be loaded with a target
        load_model(shared_draft, embedding=torch.zeros(3, 3))


def test_native_chains_over_a_draft_vocabulary_equal_the_per_op_path(llama_dir, shared_draft, monkeypatch):
    """Chains drafted natively map each picked lm_head row to its token before embedding
    it: every step's proposals and the outputs equal the rounds run op by op."""
    from helpers.drafting import PROMPTS, record_drafts
    spec = SpecConfig(method="draft_target", draft=shared_draft, num_draft_tokens=4)
    a, out_a, used = record_drafts(llama_dir, spec, PROMPTS, True, monkeypatch)
    b, out_b, _ = record_drafts(llama_dir, spec, PROMPTS, False, monkeypatch)
    assert any(used), "the native chain never ran"
    assert a == b and out_a == out_b
