"""MTP heads that read intermediate target layers (EAGLE-3 style fused features): the
fusion against its definition in torch functional ops, a zero fusion drafting exactly as
the head it starts from, lossless chains, trees and the single-token schedule, the
checkpoint field and its misuse."""
import json
import shutil

import pytest
import torch
import torch.nn.functional as F

from helpers.mtp_fixtures import random_head, save
from helpers.prompts import prompts
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.models.config import CheckpointError

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def test_fusion_equals_its_definition_and_starts_at_the_final_states(llama_dir):
    head = random_head(llama_dir, feature_layers=(0, 1), fusion_std=0.1)
    n, H = 7, head.config.hidden_size
    g = torch.Generator().manual_seed(0)
    final, streams = torch.randn(n, H, generator=g), 50 * torch.randn(n, 2, H, generator=g)
    norms = [F.rms_norm(streams[:, j], (H,), head.fusion.norms[j].weight, head.config.rms_norm_eps) for j in range(2)]
    want = final + F.linear(torch.cat(norms, -1), head.fusion.proj.weight)
    with torch.no_grad():
        torch.testing.assert_close(head.target_features(final, streams), want, rtol=1e-5, atol=1e-5)
        head.fusion.proj.weight.zero_()
        assert torch.equal(head.target_features(final, streams), final)
    with pytest.raises(ValueError, match="pass their streams"):
        head.target_features(final)
    with pytest.raises(ValueError, match=r"expected streams of shape \[7, 2, hidden\]"):
        head.target_features(final, streams[:, :1])
    assert random_head(llama_dir).target_features(final) is final   # a plain head reads the final states


def test_a_zero_fusion_drafts_exactly_as_the_head_it_starts_from(llama_dir, heads, tmp_path):
    """Same drafts, same acceptance, token for token: the engine hands the fused head the
    features it computes from the captured streams."""
    from sonarspec_ext.models.loader import load_model
    from sonarspec_ext.models.mtp import MTPHead
    from sonarspec_ext.models.mtp_loader import read_mtp_head
    start = read_mtp_head(heads["trained"], load_model(llama_dir).config, compact_weights=False)
    fused = MTPHead(start.config, start.layout, (0, 1))
    missing, unexpected = fused.load_state_dict(start.state_dict(), strict=False)
    assert not unexpected and missing and all(k.startswith("fusion.") for k in missing)
    d = save(fused, str(tmp_path / "zero"))
    assert json.load(open(tmp_path / "zero" / "config.json"))["feature_layers"] == [0, 1]
    ps = prompts(8, seed=70)
    runs = []
    for draft in (heads["trained"], d):
        llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=draft, num_draft_tokens=3))
        runs.append(([o.token_ids for o in llm.generate(ps, GREEDY)], llm.stats()["accepted_per_position"]))
    assert runs[0] == runs[1] and runs[0][1][0] > 0


@pytest.mark.parametrize("method,k", [("mtp", 1), ("mtp", 3), ("eagle_tree", 3)])
def test_a_fused_head_is_lossless(llama_dir, heads, plain_greedy, method, k):
    ps = prompts(12, seed=71 + k)
    llm = LLM(llama_dir, spec=SpecConfig(method=method, draft=heads["fused"], num_draft_tokens=k))
    assert llm.engine.runner.capture == (0,)
    for bs in (1, 12):
        assert [o.token_ids for o in llm.generate(ps[:bs], GREEDY)] == plain_greedy(ps[:bs], GREEDY)
    assert llm.stats()["num_accepted_tokens"] >= 20   # a trained fused head: acceptance exercised
    assert llm.engine.planner.num_free_pages == llm.engine.kv_cache.num_pages


def test_feature_layers_that_do_not_fit_are_refused(llama_dir, heads, tmp_path):
    for layers, match in (([2], r"in \[0, 2\)"), ([0, 0], "distinct"), ("0", "must list"), ([True], "must list")):
        bad = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        shutil.copytree(heads["fused"], bad)
        cfg = json.load(open(bad / "config.json"))
        cfg["feature_layers"] = layers
        json.dump(cfg, open(bad / "config.json", "w"))
        with pytest.raises(CheckpointError, match=match):
            LLM(llama_dir, spec=SpecConfig(method="mtp", draft=str(bad)))
    head = random_head(llama_dir, feature_layers=(1,))
    for fmt in ("eagle1", "deepseek"):
        with pytest.raises(ValueError, match="save it as sonarspec"):
            save(head, str(tmp_path / fmt), fmt, target_num_layers=2)
    with pytest.raises(ValueError, match="distinct layer indices"):
        random_head(llama_dir, feature_layers=(-1,))
    with pytest.raises(ValueError, match=r"reads target layers \[5\], the target has 2"):
        random_head(llama_dir, feature_layers=(5,))
