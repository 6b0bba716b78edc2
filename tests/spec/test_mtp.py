"""MTP heads: the head against a transformers oracle, lossless chain decoding (greedy and
sampled), every checkpoint layout, refused misfits, page accounting."""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.mtp_fixtures import random_head, save
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.layers.attention import DenseCausalAttention
from sonarspec_ext.models.config import CheckpointError
from helpers.spec_checks import check_greedy_with_stops, check_sampled_law, run_random_workload
from helpers.prompts import prompts


@pytest.mark.parametrize("layout,num_layers", [("rmsnorm", 1), ("eagle1", 1), ("rmsnorm", 2), ("eagle1", 3)])
def test_head_matches_a_transformers_decoder_layer(llama_dir, layout, num_layers):
    """The head's output equals the formula written with transformers' LlamaDecoderLayer
    (a deeper head: its layers one after another, the first without an input norm in the
    eagle1 layout)."""
    import transformers
    head = random_head(llama_dir, layout, num_layers=num_layers).eval()
    cfg = head.config
    hf_cfg = transformers.LlamaConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                                      num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                                      rms_norm_eps=cfg.rms_norm_eps, max_position_embeddings=cfg.max_position_embeddings,
                                      rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling, vocab_size=cfg.vocab_size)
    hf_cfg._attn_implementation = "eager"
    layers = []
    for i in range(num_layers):
        layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer(hf_cfg, i)
        p = f"layers.{i}."
        layer.load_state_dict({k[len(p):]: v for k, v in head.state_dict().items() if k.startswith(p)},
                              strict=layout == "rmsnorm" or i > 0)
        if layout == "eagle1" and i == 0:
            layer.input_layernorm = torch.nn.Identity()
        layers.append(layer)
    rope = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(hf_cfg)
    T = 12
    ids, feats = torch.randint(0, 256, (T,)), torch.randn(T, cfg.hidden_size)
    with torch.no_grad():
        e = head.embed(ids)
        if layout == "rmsnorm":
            rms = lambda x, w: w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)  # noqa: E731
            x = torch.nn.functional.linear(torch.cat([rms(e, head.enorm.weight), rms(feats, head.hnorm.weight)], -1),
                                           head.fc.weight)
        else:
            x = torch.nn.functional.linear(torch.cat([e, feats], -1), head.fc.weight, head.fc.bias)
        pos = torch.arange(T)[None]
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        ref = x[None]
        for layer in layers:
            out = layer(ref, attention_mask=mask, position_ids=pos, position_embeddings=rope(x[None], pos))
            ref = out[0] if isinstance(out, tuple) else out
        ref = ref[0]
        if layout == "rmsnorm":
            ref = rms(ref, head.norm.weight)
        got = head(ids, torch.arange(T), DenseCausalAttention(1, T), feats)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("which", ["random", "trained"])
def test_greedy_equals_plain_decoding(k, which, llama_dir, heads, plain_greedy):
    ps = prompts(16, seed=30 + k)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=heads[which], num_draft_tokens=k))
    for bs in (1, 6, 16):
        assert [o.token_ids for o in llm.generate(ps[:bs], params)] == plain_greedy(ps[:bs], params)
    s = llm.stats()
    assert s["num_draft_tokens"] > 0 and len(s["accepted_per_position"]) == k
    if which == "trained":   # acceptance exercised many times, not only rejection
        assert s["num_accepted_tokens"] >= 20, s
    assert llm.engine.planner.num_free_pages == llm.engine.kv_cache.num_pages


def test_greedy_equals_transformers_with_stops_and_chunked_prefill(llama_dir, heads):
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=3),
              max_num_batched_tokens=7)   # prompts arrive in chunks the head must follow
    check_greedy_with_stops(llm, llama_dir, prompts(4, seed=41))
    assert llm.stats()["num_accepted_tokens"] >= 5


@pytest.mark.parametrize("temperature,top_k,top_p,draft_sampling,k", [
    (1.0, 0, 1.0, True, 3), (0.7, 0, 1.0, False, 3), (1.3, 20, 0.9, True, 3), (0.8, 0, 1.0, False, 1),
    (1.0, 30, 0.95, True, 1)])
def test_sampled_output_follows_the_target_distribution(llama_dir, heads, temperature, top_k, top_p,
                                                        draft_sampling, k):
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=k),
              max_num_seqs=256, draft_sampling=draft_sampling)
    assert check_sampled_law(llm, llama_dir, temperature, top_k, top_p)["num_accepted_tokens"] > 0


def test_single_token_schedule_has_no_host_sync_and_is_lossless(llama_dir, heads, plain_greedy, monkeypatch):
    import sonarspec_ext.engine.engine as engine_mod
    from sonarspec_ext.engine.single_token_step import HostSyncError, forbid_host_syncs, single_token_step
    calls = []

    def counted(*a):
        calls.append(1)
        return single_token_step(*a)
    monkeypatch.setattr(engine_mod, "single_token_step", counted)
    ps = prompts(16, seed=50)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=1),
              check_host_syncs=True)   # any host read of a tensor in the region raises
    for bs in (1, 6, 16):
        assert [o.token_ids for o in llm.generate(ps[:bs], params)] == plain_greedy(ps[:bs], params)
    assert len(calls) > 30 and llm.stats()["num_accepted_tokens"] >= 20   # most steps took the schedule
    seeded = SamplingParams(max_tokens=12, temperature=0.9, seed=3, ignore_eos=True)
    assert len(llm.generate(ps[:4], seeded)[0].token_ids) == 12   # sampled path, same guard
    with pytest.raises(HostSyncError):   # the guard does catch a sync
        with forbid_host_syncs():
            torch.tensor([1.0]).item()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_single_token_schedule_on_cuda_without_sync(llama_dir, heads):
    ps = prompts(8, seed=51)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in LLM(llama_dir, device="cuda").generate(ps, params)]
    llm = LLM(llama_dir, device="cuda", spec=SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=1),
              check_host_syncs=True)
    assert [o.token_ids for o in llm.generate(ps, params)] == ref


def _greedy(llama_dir, draft, ps, k=3):
    """Greedy outputs, and the loaded head's output on fixed inputs (equal heads agree)."""
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=draft, num_draft_tokens=k))
    out = [o.token_ids for o in llm.generate(ps, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))]
    head = llm.engine.proposer.head
    g = torch.Generator().manual_seed(0)
    ids, feats = torch.randint(0, 256, (10,), generator=g), torch.randn(10, head.config.hidden_size, generator=g)
    with torch.no_grad():
        probe = head(ids, torch.arange(10), DenseCausalAttention(1, 10), feats)
    return out, probe


def test_eagle1_layout_loads_with_public_key_names(llama_dir, heads, tmp_path, plain_greedy):
    head = random_head(llama_dir, "eagle1", seed=1)
    d = save(head, str(tmp_path / "eagle1"), "eagle1")
    keys = set(load_file(os.path.join(d, "model.safetensors")))
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight",
            "layers.0.post_attention_layernorm.weight"} <= keys
    assert not any("input_layernorm" in k or "norm.weight" == k for k in keys)
    assert load_file(os.path.join(d, "model.safetensors"))["fc.weight"].shape == (64, 128)
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["num_hidden_layers"] == 1 and cfg["architectures"] == ["LlamaForCausalLM"]
    ps = prompts(6, seed=3)
    got, stats = _greedy(llama_dir, d, ps)
    assert got == plain_greedy(ps, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    torch.testing.assert_close(stats, _greedy(llama_dir, heads["random_eagle1"], ps)[1], rtol=0, atol=0)


def test_a_deeper_head_round_trips_and_drafts_losslessly(llama_dir, tmp_path, plain_greedy, monkeypatch):
    """A head of two decoder layers: stored with the first layer under the one-layer name
    and the second as ``layers.1.*``; loaded, it computes what it computed before saving,
    and drafts losslessly, the native chains drafting what the per-op path drafts; the
    one-layer layouts and bad layer counts are refused."""
    import sonarspec_ext.spec.chains as chains_mod
    head = random_head(llama_dir, num_layers=2, seed=5)
    d = save(head, str(tmp_path / "deep"))
    keys = set(load_file(os.path.join(d, "model.safetensors")))
    assert {"layer.self_attn.q_proj.weight", "layers.1.self_attn.q_proj.weight", "layers.1.mlp.down_proj.weight"} <= keys
    assert not any(k.startswith("layers.0.") for k in keys)
    assert json.load(open(os.path.join(d, "config.json")))["num_hidden_layers"] == 2
    ps, params = prompts(6, seed=5), SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    native, probe = _greedy(llama_dir, d, ps)
    g = torch.Generator().manual_seed(0)
    ids, feats = torch.randint(0, 256, (10,), generator=g), torch.randn(10, head.config.hidden_size, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(probe, head.eval()(ids, torch.arange(10), DenseCausalAttention(1, 10), feats),
                                   rtol=1e-5, atol=1e-5)
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=d, num_draft_tokens=3))
    assert [o.token_ids for o in llm.generate(ps, params)] == native == plain_greedy(ps, params)
    monkeypatch.setattr(chains_mod, "native_chains", lambda *a, **kw: None)
    per_op = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=d, num_draft_tokens=3))
    assert [o.token_ids for o in per_op.generate(ps, params)] == native
    assert per_op.stats()["accepted_per_position"] == llm.stats()["accepted_per_position"]
    for fmt in ("eagle1", "deepseek"):
        with pytest.raises(ValueError, match="layout holds one decoder layer, this head has 2"):
            save(random_head(llama_dir, "eagle1" if fmt == "eagle1" else "rmsnorm", num_layers=2),
                 str(tmp_path / fmt), fmt, target_num_layers=2)
    for bad in (0, 17):
        cfg = json.load(open(os.path.join(d, "config.json")))
        cfg["num_hidden_layers"] = bad
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        with pytest.raises(CheckpointError, match="num_hidden_layers .*must be"):
            LLM(llama_dir, spec=SpecConfig(method="mtp", draft=d))
    cfg["num_hidden_layers"] = 3   # more layers than the file holds
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    with pytest.raises(CheckpointError, match="layers.2"):
        LLM(llama_dir, spec=SpecConfig(method="mtp", draft=d))


def _deepseek_target(llama_dir, head, path):
    """A copy of the target checkpoint with the head stored as model.layers.{L} (DeepSeek-V3)."""
    shutil.copytree(llama_dir, path)
    L = json.load(open(os.path.join(llama_dir, "config.json")))["num_hidden_layers"]
    tmp = path + "-head"
    save(head, tmp, "deepseek", target_num_layers=L)
    state = load_file(os.path.join(path, "model.safetensors"))
    extra = load_file(os.path.join(tmp, "model.safetensors"))
    extra[f"model.layers.{L}.shared_head.head.weight"] = state["lm_head.weight"].clone()
    save_file({**state, **extra}, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return L, tmp


def test_deepseek_layout_inside_the_target_and_alone(llama_dir, heads, tmp_path, plain_greedy):
    head = random_head(llama_dir, "rmsnorm")   # same weights as heads["random"]
    target = str(tmp_path / "target_with_mtp")
    L, alone = _deepseek_target(llama_dir, head, target)
    keys = set(load_file(os.path.join(alone, "model.safetensors")))
    assert {f"model.layers.{L}.{n}" for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight",
                                              "shared_head.norm.weight", "input_layernorm.weight",
                                              "self_attn.q_proj.weight", "mlp.gate_proj.weight")} <= keys
    ps = prompts(6, seed=4)
    ref_out, ref_stats = _greedy(llama_dir, heads["random"], ps)
    for target_dir, draft in ((target, None), (llama_dir, alone)):
        got, stats = _greedy(target_dir, draft, ps)
        assert got == ref_out == plain_greedy(ps, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
        torch.testing.assert_close(stats, ref_stats, rtol=0, atol=0)


def test_misfit_heads_are_refused(llama_dir, heads, tmp_path):
    wide = tmp_path / "wide"
    shutil.copytree(heads["random"], wide)
    cfg = json.load(open(wide / "config.json"))
    cfg["hidden_size"] = 96
    json.dump(cfg, open(wide / "config.json", "w"))
    with pytest.raises(CheckpointError, match="hidden size 96 does not match the target's 64"):
        LLM(llama_dir, spec=SpecConfig(method="mtp", draft=str(wide)))
    eagle = tmp_path / "eagle_vocab"
    save(random_head(llama_dir, "eagle1"), str(eagle), "eagle1")
    state = load_file(eagle / "model.safetensors")
    state["embed_tokens.weight"] = torch.zeros(500, 64)
    save_file(state, str(eagle / "model.safetensors"))
    with pytest.raises(CheckpointError, match="another vocabulary"):
        LLM(llama_dir, spec=SpecConfig(method="mtp", draft=str(eagle)))
    eagle3 = tmp_path / "eagle3"
    shutil.copytree(heads["random"], eagle3)
    save_file({"midlayer.hidden_norm.weight": torch.ones(64), "fc.weight": torch.zeros(64, 192)},
              str(eagle3 / "model.safetensors"))
    with pytest.raises(CheckpointError, match="EAGLE-3"):
        LLM(llama_dir, spec=SpecConfig(method="mtp", draft=str(eagle3)))
    with pytest.raises(CheckpointError, match="MTP head directory not found"):
        LLM(llama_dir, spec=SpecConfig(method="mtp", draft=str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="no MTP head"):   # the target holds none, none packaged for it
        LLM(llama_dir, spec=SpecConfig(method="mtp"))


def test_pages_return_after_random_requests_aborts_and_preemption(llama_dir, heads):
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=3),
              page_size=4, num_pages=40, max_num_seqs=8, max_num_batched_tokens=32)
    eng = run_random_workload(llm, seed=5)
    assert eng.planner.num_free_pages == 40 and not eng.proposer.state and not eng.proposer.waiting
    assert eng.finished.totals["num_preemptions"] > 0


def test_draft_vocabulary_restricts_proposals_and_stays_lossless(llama_dir, heads, tmp_path, plain_greedy):
    from sonarspec_ext.models.mtp_loader import load_mtp_head
    from sonarspec_ext.models.loader import load_model
    vocab = torch.arange(0, 256, 2)   # even byte tokens only
    head = load_mtp_head(heads["trained"], load_model(llama_dir))
    head.set_draft_vocab(vocab)
    d = save(head, str(tmp_path / "restricted"))
    cfg = json.load(open(os.path.join(d, "config.json")))
    assert cfg["draft_vocab_size"] == 128 and torch.equal(load_file(os.path.join(d, "model.safetensors"))["draft_vocab"], vocab)
    ps = prompts(8, seed=60)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=d, num_draft_tokens=3))
    proposed = []
    real = llm.engine.proposer.propose
    llm.engine.proposer.propose = lambda seqs, ks: [proposed.extend(x.token_ids) or x for x in real(seqs, ks)]
    assert [o.token_ids for o in llm.generate(ps, params)] == plain_greedy(ps, params)
    assert proposed and all(t % 2 == 0 for t in proposed)
    with pytest.raises(ValueError, match="draft vocabulary ids"):
        head.set_draft_vocab(torch.tensor([0, 300]))


@pytest.mark.parametrize("fixture", ["qwen_dir", "mistral_dir"])
@pytest.mark.parametrize("layout", ["rmsnorm", "eagle1"])
def test_heads_for_biased_and_sliding_window_targets_at_the_context_limit(fixture, layout, request, tmp_path):
    """Qwen2 (q/k/v biases in the head layer) and Mistral (sliding window in the head's
    attention), with requests running into max_model_len: output equals plain decoding."""
    target = request.getfixturevalue(fixture)
    head = save(random_head(target, layout), str(tmp_path / "head"))
    ps = prompts(8, seed=9)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    ref = [o.token_ids for o in LLM(target, max_model_len=40).generate(ps, params)]
    assert any(len(r) < 30 for r in ref)   # some requests stop at the context limit
    for k in (1, 3):
        llm = LLM(target, spec=SpecConfig(method="mtp", draft=head, num_draft_tokens=k), max_model_len=40)
        assert [o.token_ids for o in llm.generate(ps, params)] == ref


def test_a_packaged_head_is_found_by_its_target_fingerprint(llama_dir, heads, monkeypatch):
    """find_mtp_head (SpecConfig(draft="default"), --spec auto) picks a packaged head only
    for the exact checkpoint it was trained on."""
    from sonarspec_ext.models.loader import checkpoint_fingerprint
    from sonarspec_ext.spec import factory
    monkeypatch.setattr(factory, "HEADS", ("h",))
    monkeypatch.setattr(factory, "installed_head", lambda name: (heads["trained"], checkpoint_fingerprint(llama_dir)))
    assert factory.find_mtp_head(llama_dir) == heads["trained"]
    monkeypatch.setattr(factory, "installed_head", lambda name: (heads["trained"], "another target"))
    assert factory.find_mtp_head(llama_dir) is None
