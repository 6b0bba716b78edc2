"""MTP head training: the unrolled chain against step-by-step inference, features against
transformers, resumable feature pass and training, the train-mtp command and its errors."""
import json
import os

import numpy as np
import pytest
import torch

from helpers.models import hf_load
from helpers.mtp_fixtures import random_head, sampled_windows
from sonarspec_ext.cli import main
from sonarspec_ext.layers.attention import DenseCausalAttention
from sonarspec_ext.models.loader import load_model
from sonarspec_ext.train.data import read_corpus
from sonarspec_ext.train.features import FeatureSet, compute_features
from sonarspec_ext.train.mtp_train import TrainConfig, train_head, unrolled_features
from sonarspec_ext.train.unroll import chain_mask
from sonarspec_ext.train.windows import PackedWindows

QUIET = dict(log=lambda *_: None)


def test_chain_mask_small_case():
    # step 2, T = 4: query i sees step-1 keys p <= i - 1 and its own step-2 key at i
    expected = torch.tensor([[0, 0, 0, 0, 1, 0, 0, 0],    # no real chain at i = 0 (left out of the loss)
                             [1, 0, 0, 0, 0, 1, 0, 0],
                             [1, 1, 0, 0, 0, 0, 1, 0],
                             [1, 1, 1, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(chain_mask(2, 4), expected)


@pytest.mark.parametrize("num_layers", [1, 2])
def test_unrolled_training_equals_chain_inference(llama_dir, num_layers):
    """Step k of the unrolled pass equals running the head as a draft chain: accurate
    features up to position i-k+1, then its own outputs, one position at a time (each of
    a deeper head's layers attending to its own keys)."""
    head = random_head(llama_dir, num_layers=num_layers)
    T, H = 9, head.config.hidden_size
    tokens, hidden = torch.randint(0, 256, (2, T)), torch.randn(2, T, H)
    with torch.no_grad():
        outs = unrolled_features(head, tokens, hidden, unroll=3)
        for b in range(2):
            for i in range(2, T - 1):
                a = i - 2   # the chain of step 3 at position i leaves the accurate positions at a
                feats, ids = [hidden[b, p] for p in range(a + 1)], [tokens[b, p + 1] for p in range(a + 1)]
                f = None
                for pos in range(a, i + 1):
                    if pos > a:
                        feats.append(f)
                        ids.append(tokens[b, pos + 1])
                    n = len(ids)
                    f = head(torch.stack(ids), torch.arange(n), DenseCausalAttention(1, n), torch.stack(feats))[-1]
                torch.testing.assert_close(outs[2][b, i], f, rtol=1e-4, atol=1e-4)


def test_features_match_transformers_and_resume(llama_dir, tmp_path):
    win = sampled_windows(llama_dir, 5, 16)
    target = load_model(llama_dir)
    import sonarspec_ext.train.features as feat
    old = feat.SHARD_WINDOWS
    feat.SHARD_WINDOWS = 2
    try:
        compute_features(target, win, str(tmp_path / "f"), "fp", "tok", "float32", batch_windows=2, **QUIET)
        first = FeatureSet(str(tmp_path / "f"))
        os.remove(tmp_path / "f" / "shard-00001.safetensors")      # an interrupted pass
        index = compute_features(target, win, str(tmp_path / "f"), "fp", "tok", "float32", **QUIET)
    finally:
        feat.SHARD_WINDOWS = old
    assert [s["num_windows"] for s in index["shards"]] == [2, 2, 1]
    again = FeatureSet(str(tmp_path / "f"))
    assert torch.equal(first.hidden, again.hidden) and torch.equal(again.tokens, torch.from_numpy(win).long())
    with torch.no_grad():
        ref = hf_load(llama_dir)(torch.from_numpy(win).long(), output_hidden_states=True).hidden_states[-1]
    torch.testing.assert_close(again.hidden, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="target_fingerprint"):
        compute_features(target, win, str(tmp_path / "f"), "other", "tok", "float32", **QUIET)
    with pytest.raises(ValueError, match="computed by another target"):
        FeatureSet(str(tmp_path / "f"), target_fp="other")


@pytest.mark.slow
def test_training_resumes_exactly(llama_dir, tmp_path, monkeypatch):
    win = sampled_windows(llama_dir, 12, 24)
    target = load_model(llama_dir)
    compute_features(target, win, str(tmp_path / "f"), "fp", "tok", "float32", **QUIET)
    fs = FeatureSet(str(tmp_path / "f"))
    cfg = TrainConfig(max_steps=6, batch_size=4, warmup=2, unroll=2, eval_every=3, checkpoint_every=3, eval_windows=4)
    straight = random_head(llama_dir)
    hist = train_head(straight, fs, fs, cfg, str(tmp_path / "a"), **QUIET)
    assert hist["train"][-1]["loss"] < hist["train"][0]["loss"]
    import sonarspec_ext.train.mtp_train as mt
    real, calls = mt.evaluate, []

    def crash_on_second(*a):   # the run dies at step 6, after the step-3 checkpoint
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a)
    monkeypatch.setattr(mt, "evaluate", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        train_head(random_head(llama_dir), fs, fs, cfg, str(tmp_path / "b"), **QUIET)
    monkeypatch.setattr(mt, "evaluate", real)
    with pytest.raises(ValueError, match="another training configuration"):
        train_head(random_head(llama_dir), fs, fs, TrainConfig(**{**cfg.__dict__, "lr": 1.0}),
                   str(tmp_path / "b"), resume=True, **QUIET)
    resumed = random_head(llama_dir, seed=7)   # different init: everything must come from the checkpoint
    train_head(resumed, fs, fs, cfg, str(tmp_path / "b"), resume=True, **QUIET)
    for (n, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=n)
    # a finished run extended: steps 7-8 run from the step-6 checkpoint, not from scratch
    with pytest.raises(ValueError, match="no fewer than the 6 steps"):
        train_head(random_head(llama_dir), fs, fs, TrainConfig(**{**cfg.__dict__, "max_steps": 5}),
                   str(tmp_path / "b"), resume=True, **QUIET)
    longer = TrainConfig(**{**cfg.__dict__, "max_steps": 8, "eval_every": 4})
    extended = random_head(llama_dir, seed=9)
    hist = train_head(extended, fs, fs, longer, str(tmp_path / "b"), resume=True, **QUIET)
    assert [r["step"] for r in hist["train"]] == list(range(1, 9)) and hist["val"][-1]["step"] == 8
    assert any(not torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), extended.state_dict().values()))


def test_feature_pass_stores_the_streams_of_the_layers_a_fused_head_reads(llama_dir, tmp_path):
    """The residual stream after layer 0 matches transformers' (its hidden_states[1]); the
    final states are those of a pass without layers; a directory keeps its layers."""
    win = sampled_windows(llama_dir, 3, 16)
    target = load_model(llama_dir)
    compute_features(target, win, str(tmp_path / "plain"), "fp", "tok", "float32", **QUIET)
    compute_features(target, win, str(tmp_path / "fused"), "fp", "tok", "float32", feature_layers=(0,), **QUIET)
    plain, fused = FeatureSet(str(tmp_path / "plain")), FeatureSet(str(tmp_path / "fused"))
    idx = torch.arange(3)
    assert plain.streams(idx) is None and fused.feature_layers == (0,)
    assert torch.equal(plain.hidden, fused.hidden)
    with torch.no_grad():
        ref = hf_load(llama_dir)(torch.from_numpy(win).long(), output_hidden_states=True).hidden_states[1]
    torch.testing.assert_close(fused.streams(idx)[:, :, 0], ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="feature_layers"):
        compute_features(target, win, str(tmp_path / "fused"), "fp", "tok", "float32", feature_layers=(1,), **QUIET)
    with pytest.raises(ValueError, match=r"the head reads target layers \[0\], the features hold \[\]"):
        train_head(random_head(llama_dir, feature_layers=(0,)), plain, plain, TrainConfig(max_steps=1),
                   str(tmp_path / "run"), **QUIET)


def _corpus(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "def", "return", "(", ")", ":", "\n"]
    for i in range(40):
        (d / ("sub" if i % 2 else "") / f"doc{i}.txt").write_text(" ".join(rng.choice(words, 60)))
    (d / "extra.jsonl").write_text("\n".join(json.dumps({"text": " ".join(rng.choice(words, 60))})
                                             for _ in range(10)))
    return d


@pytest.mark.slow
def test_train_mtp_command_end_to_end(llama_dir, tmp_path):
    corpus = _corpus(tmp_path)
    train, val = read_corpus([str(corpus)])
    assert len(train) + len(val) == 50 and val
    out = tmp_path / "heads" / "head"   # its parent is made
    rc = main(["train-mtp", "--target", llama_dir, "--data", str(corpus), "--out", str(out), "--max-steps", "4",
               "--seq-len", "32", "--max-windows", "40", "--eval-every", "2", "--batch-size", "4",
               "--formats", "sonarspec", "deepseek"])
    assert rc == 0
    info = json.load(open(out / "training.json"))
    v = info["engine_validation"]
    assert v["equal_to_plain_decoding"] and len(v["accepted_per_position"]) == 3
    assert os.path.isfile(tmp_path / "heads" / "head-deepseek" / "model.safetensors")
    assert not any(n.startswith((".export-", ".probe-")) for n in os.listdir(tmp_path / "heads"))


def test_train_mtp_bad_input(llama_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["train-mtp", "--target", llama_dir, "--data", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "holds no non-empty text documents" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "x"}\n')
    assert main(["train-mtp", "--target", llama_dir, "--data", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "expected a JSON object with a 'text' field" in capsys.readouterr().err
    assert main(["train-mtp", "--target", llama_dir, "--data", str(_corpus(tmp_path)),
                 "--out", "/proc/no/such/dir"]) == 2
    assert "cannot be written" in capsys.readouterr().err
    assert main(["train-mtp", "--target", llama_dir, "--data", str(empty), "--out", str(tmp_path / "o"),
                 "--layout", "eagle1", "--formats", "deepseek"]) == 2
    assert "can be exported as sonarspec or eagle1" in capsys.readouterr().err
    assert main(["train-mtp", "--target", llama_dir, "--data", str(empty), "--out", str(tmp_path / "o"),
                 "--head-layers", "2", "--formats", "deepseek"]) == 2
    assert "a head of 2 decoder layers can be exported as sonarspec only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train-mtp", "--target", llama_dir, "--data", str(empty), "--out", str(tmp_path / "o"),
              "--head-layers", "0"])
    assert "--head-layers: must be at least 1" in capsys.readouterr().err
    assert main(["train-mtp", "--target", llama_dir, "--data", str(empty), "--out", str(tmp_path / "o"),
                 "--head-layers", "17"]) == 2
    assert "an MTP head has 1 to 16 decoder layers, got 17" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_jsonl_split_field_decides_the_held_out_documents(tmp_path):
    f = tmp_path / "c.jsonl"
    recs = [{"text": f"doc {i}", "split": "val" if i % 3 == 0 else "train"} for i in range(12)]
    f.write_text("\n".join(json.dumps(r) for r in recs))
    train, val = read_corpus([str(f)])
    assert [d.text for d in val] == [f"doc {i}" for i in range(0, 12, 3)] and len(train) == 8
    f.write_text(json.dumps({"text": "x", "split": "test"}))
    with pytest.raises(ValueError, match="'split' must be 'train' or 'val'"):
        read_corpus([str(f)])


@pytest.mark.slow
def test_train_mtp_short_windows_on_a_compact_target_and_a_file_as_out(tmp_path):
    """bfloat16-weight targets keep float32 activations: a 64-token feature pass (native
    attention) needs a float32 KV pool; --out naming a file is refused before training."""
    corpus = _corpus(tmp_path)
    (tmp_path / "taken").write_text("x")
    assert main(["train-mtp", "--data", str(corpus), "--out", str(tmp_path / "taken"), "--max-steps", "1"]) == 2
    rc = main(["train-mtp", "--data", str(corpus), "--out", str(tmp_path / "h64"), "--max-steps", "2",
               "--seq-len", "64", "--max-windows", "8", "--eval-every", "1", "--batch-size", "2"])
    assert rc == 0 and os.path.isfile(tmp_path / "h64" / "model.safetensors")


@pytest.mark.slow
def test_features_of_the_served_quantization_and_a_warm_start(llama_dir, heads, tmp_path):
    """``quantization``: the feature pass and the engine validation run the target as
    loaded with it (features equal a pass over the quantized model, not the float one);
    ``init_from`` starts from a saved head: at learning rate 0 the export is that head."""
    from sonarspec_ext.models.mtp_loader import read_mtp_head
    from sonarspec_ext.train.train_mtp import train_mtp
    corpus, out, work = _corpus(tmp_path), tmp_path / "head", tmp_path / "work"
    cfg = TrainConfig(max_steps=1, batch_size=2, lr=0.0, warmup=1, eval_every=1, checkpoint_every=1, eval_windows=2)
    info = train_mtp(llama_dir, [str(corpus)], str(out), str(work), seq_len=32, max_windows=6, cfg=cfg,
                     feature_dtype="float32", quantization="q8_0", init_from=heads["trained"],
                     validate_prompts=2, validate_tokens=8, **QUIET)
    assert info["target_quantization"] == "q8_0" and info["engine_validation"]["equal_to_plain_decoding"]
    stored = FeatureSet(str(work / "features" / "train"))
    lay = stored.layout(torch.arange(len(stored)))
    win = PackedWindows(stored.tokens.numpy().astype(np.int32), lay.positions.numpy().astype(np.int32),
                        lay.segments.numpy().astype(np.int16), lay.drafted.numpy())
    for quant, same in (("q8_0", True), ("none", False)):
        compute_features(load_model(llama_dir, quantization=quant), win, str(tmp_path / quant), "fp", "tok",
                         "float32", **QUIET)
        assert torch.equal(FeatureSet(str(tmp_path / quant)).hidden, stored.hidden) == same, quant
    target = load_model(llama_dir)
    start, got = (read_mtp_head(p, target.config, compact_weights=False) for p in (heads["trained"], str(out)))
    for (n, a), (_, b) in zip(start.state_dict().items(), got.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=n)
    with pytest.raises(ValueError, match="the head has the rmsnorm layout, this run trains eagle1"):
        train_mtp(llama_dir, [str(corpus)], str(tmp_path / "h2"), str(work), layout="eagle1", seq_len=32,
                  max_windows=6, cfg=cfg, feature_dtype="float32", quantization="q8_0",
                  init_from=heads["trained"], **QUIET)


def test_a_deeper_head_starts_from_a_shallower_one(llama_dir, heads, tmp_path):
    """``head_layers`` with ``init_from`` a one-layer head: the added layer starts as an
    identity, so at learning rate 0 the exported two-layer head computes what the start
    head computes, and drafts losslessly in the engine; a start deeper than the run, refused."""
    from sonarspec_ext.models.mtp_loader import read_mtp_head
    from sonarspec_ext.train.train_mtp import train_mtp
    corpus, out, work = _corpus(tmp_path), tmp_path / "head", tmp_path / "work"
    cfg = TrainConfig(max_steps=1, batch_size=2, lr=0.0, warmup=1, eval_every=1, checkpoint_every=1, eval_windows=2)
    kw = dict(seq_len=32, max_windows=6, cfg=cfg, feature_dtype="float32", validate_prompts=2, validate_tokens=8,
              **QUIET)
    info = train_mtp(llama_dir, [str(corpus)], str(out), str(work), init_from=heads["trained"], head_layers=2, **kw)
    assert info["engine_validation"]["equal_to_plain_decoding"]
    target = load_model(llama_dir)
    start, got = (read_mtp_head(p, target.config, compact_weights=False).bind(target).eval()
                  for p in (heads["trained"], str(out)))
    assert len(got.layers) == 2 and got.layers[1].mlp.gate_proj.weight.abs().sum() > 0
    g = torch.Generator().manual_seed(0)
    ids, feats = torch.randint(0, 256, (10,), generator=g), torch.randn(10, target.config.hidden_size, generator=g)
    with torch.no_grad():
        a, b = (h(ids, torch.arange(10), DenseCausalAttention(1, 10), feats) for h in (start, got))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="the head has 2 decoder layers, this run trains 1"):
        train_mtp(llama_dir, [str(corpus)], str(tmp_path / "h2"), str(work), init_from=str(out), **kw)


@pytest.mark.slow
def test_a_fused_head_trains_from_a_plain_one(llama_dir, heads, tmp_path):
    """``feature_layers`` with ``init_from`` a head without them: the fusion starts at zero
    and learns, the export records its layers, keeps the start's draft vocabulary and
    drafts losslessly in the engine; a start that reads other layers is refused."""
    from sonarspec_ext.models.mtp_loader import read_mtp_head, save_mtp_head
    from sonarspec_ext.train.train_mtp import train_mtp
    corpus, out, work = _corpus(tmp_path), tmp_path / "head", tmp_path / "work"
    start = read_mtp_head(heads["trained"], load_model(llama_dir).config, compact_weights=False)
    start.set_draft_vocab(torch.arange(0, 256, 2))
    save_mtp_head(start, str(tmp_path / "start"))
    cfg = TrainConfig(max_steps=3, batch_size=2, lr=1e-3, warmup=1, eval_every=3, checkpoint_every=3, eval_windows=2)
    kw = dict(seq_len=32, max_windows=6, cfg=cfg, feature_dtype="float32", validate_prompts=2, validate_tokens=8,
              **QUIET)
    info = train_mtp(llama_dir, [str(corpus)], str(out), str(work), init_from=str(tmp_path / "start"),
                     feature_layers=(0,), **kw)
    assert info["feature_layers"] == [0] and info["engine_validation"]["equal_to_plain_decoding"]
    assert FeatureSet(str(work / "features-0" / "train")).feature_layers == (0,)
    head = read_mtp_head(str(out), load_model(llama_dir).config, compact_weights=False)
    assert head.feature_layers == (0,) and head.fusion.proj.weight.abs().sum() > 0
    assert torch.equal(head.draft_vocab, torch.arange(0, 256, 2)) and info["draft_vocab_size"] == 128
    with pytest.raises(ValueError, match=r"reads target layers \[0\], this run trains one reading \[1\]"):
        train_mtp(llama_dir, [str(corpus)], str(tmp_path / "h2"), str(work), init_from=heads["fused"],
                  feature_layers=(1,), **kw)
