"""The native decoder stack's phase profile (``_C.set_stack_profile`` / ``take_stack_profile``):
forwards counted per (layers, rows), phase times within the calls' wall time, and the
stack's results unchanged by it."""
from __future__ import annotations

import json
import sys
import time

import pytest
import torch

from helpers.models import make_hf_model
from helpers.tools import import_tool
from sonarspec_ext import LLM, _C
from sonarspec_ext.models.loader import load_model
from sonarspec_ext.ops.linear import native_gemm_threads
from sonarspec_ext.runtime.kv_cache import KVCache
from sonarspec_ext.runtime.metadata import build_metadata
from sonarspec_ext.runtime.native_stack import build_native_stack, run_native_stack

PAGE = 4
PHASES = ["norm", "qkv", "rope", "kv_store", "attention", "o_proj", "mlp", "other"]


def _step(model, num_query, seed):
    """A fresh random KV cache, the model's native stack over it, and a step of
    ``num_query`` tokens per sequence (token ids, positions, metadata)."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    kv = KVCache(cfg, num_pages=40, page_size=PAGE, dtype=torch.float32, device="cpu")
    kv.k.copy_(torch.randn(kv.k.shape, generator=g))
    kv.v.copy_(torch.randn(kv.v.shape, generator=g))
    rows = [(3 + 5 * i, n, [i + len(num_query) * p for p in range((3 + 5 * i + n + PAGE - 1) // PAGE)])
            for i, n in enumerate(num_query)]
    meta, positions = build_metadata(rows, PAGE, "cpu", native_attention=True)
    ids = torch.randint(0, cfg.vocab_size, (sum(num_query),), generator=g)
    return build_native_stack(model, kv), ids, positions, meta


def _run(model, num_query, seed):
    stack, ids, positions, meta = _step(model, num_query, seed)
    with torch.inference_mode(), native_gemm_threads():
        out = run_native_stack(stack, model, ids, positions, meta)
    assert out is not None, "the stack did not run the step"
    return out


def test_the_profile_counts_each_forward_by_rows_and_leaves_results_unchanged(tmp_path):
    make_hf_model(str(tmp_path / "m"), "llama", seed=5, num_key_value_heads=2)
    model = load_model(str(tmp_path / "m"), quantization="none")
    layers = model.config.num_hidden_layers
    plain = [_run(model, [3, 1, 4], 1), _run(model, [1], 2)]
    try:
        _C.set_stack_profile(True)
        t0 = time.perf_counter()
        profiled = [_run(model, [3, 1, 4], 1), _run(model, [3, 1, 4], 1), _run(model, [1], 2)]
        wall = time.perf_counter() - t0
        table = _C.take_stack_profile()
        assert _C.take_stack_profile() == []   # taking it empties it
    finally:
        _C.set_stack_profile(False)
    assert torch.equal(profiled[0], plain[0]) and torch.equal(profiled[1], plain[0])
    assert torch.equal(profiled[2], plain[1])
    assert [(r["layers"], r["rows"], r["forwards"]) for r in table] == [(layers, 1, 1), (layers, 8, 2)]
    for r in table:
        assert list(r["seconds"]) == PHASES
        assert all(s >= 0 for s in r["seconds"].values())
        assert r["seconds"]["mlp"] > 0 and r["seconds"]["qkv"] > 0
    assert 0 < sum(s for r in table for s in r["seconds"].values()) <= wall


def test_the_profile_records_nothing_while_off(tmp_path):
    make_hf_model(str(tmp_path / "m"), "llama", seed=5, num_key_value_heads=2)
    model = load_model(str(tmp_path / "m"), quantization="none")
    _C.set_stack_profile(True)
    _run(model, [2], 3)
    _C.set_stack_profile(False)   # switching empties the table
    _run(model, [2], 3)
    assert _C.take_stack_profile() == []


def test_profile_spec_sums_the_rounds_per_stack_and_size():
    tool = import_tool("profile_spec")
    sec = lambda v: dict.fromkeys(PHASES, v)   # noqa: E731
    rounds = [{"layers": 30, "rows": 1, "forwards": 10, "seconds": sec(1e-3)},
              {"layers": 1, "rows": 3, "forwards": 4, "seconds": sec(4e-6)},
              {"layers": 30, "rows": 1, "forwards": 30, "seconds": sec(3e-3)},
              {"layers": 30, "rows": 3, "forwards": 2, "seconds": sec(8e-6)}]
    table = tool._phase_table(rounds)
    assert [(p["layers"], p["rows"], p["forwards"]) for p in table] == [(30, 1, 40), (30, 3, 2), (1, 3, 4)]
    assert table[0]["us_per_forward"] == pytest.approx(sec(100.0))   # 4 ms over 40 forwards
    assert table[1]["us_per_forward"] == pytest.approx(sec(4.0))
    assert tool._most_run(table, per_stack=1) == [table[0], table[2]]


@pytest.mark.slow
def test_profile_spec_reports_the_stack_phases(tmp_path, monkeypatch):
    tool = import_tool("profile_spec")
    out = tmp_path / "p.json"
    monkeypatch.setattr(sys, "argv", ["profile_spec", "--schemes", "plain", "mtp:2", "--rounds", "1",
                                      "--max-tokens", "8", "--stack-phases", "--json", str(out)])
    tool.main()
    layers = LLM("default").engine.model.config.num_hidden_layers
    for scheme in ("plain", "mtp:2"):
        o = json.loads(out.read_text())["schemes"][scheme]
        target = [p for p in o["stack_phases"] if p["layers"] == layers]
        assert target and all(list(p["us_per_forward"]) == PHASES for p in target)
        # the phases lie inside the target stack's native calls (decode steps: with the lm_head)
        per_step = sum(p["forwards"] * sum(p["us_per_forward"].values()) for p in target) / o["steps"]
        native = o["native_us"]["target stack"] + o["native_us"]["target decode rows"]
        assert 0 < per_step <= native * 1.001
