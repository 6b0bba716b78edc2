"""Weights in one huge-page arena (models/weight_arena.py) and KV pools on huge pages: every
weight keeps its values, identity and sharing (tied, fused, row views), a draft model's
shared embedding stays its target's, the model computes the same logits bit for bit as with
weights in their own allocations, and the huge-page advice obeys its switch and alignment."""
import json
import os
import subprocess
import sys

import gguf
import pytest
import torch

import sonarspec_ext.models.loader as loader
from helpers.drafting import shared_draft_model
from helpers.gguf_fixtures import write_gguf
from helpers.models import CHATML
from helpers.parity import paged_logits
from sonarspec_ext import _C, LLM, SpecConfig
from sonarspec_ext.bench import weight_bytes
from sonarspec_ext.models.draft_llm import load_draft_model
from sonarspec_ext.models.mtp_loader import load_mtp_head, save_mtp_head
from sonarspec_ext.models.weight_arena import pack_weights, tensor_span, union_bytes, weight_tensors
from sonarspec_ext.ops.host_memory import HUGE_PAGE, huge_page_empty, huge_page_zeros
from sonarspec_ext.ops.quantized import QuantizedMatrix
from sonarspec_ext.runtime.kv_cache import KVCache

def _unpacked(path, monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setattr(loader, "pack_weights", lambda *a, **k: 0)
        return loader.load_model(path, **kw)


def _one_run(model) -> bool:
    """Whether the model's weights lie back to back (gaps only for alignment)."""
    spans = sorted(tensor_span(t) for t in weight_tensors(model))
    return spans[-1][1] - spans[0][0] < union_bytes(spans) + 64 * len(spans)


@pytest.mark.parametrize("kind", ["float", "q8_0"])
def test_packed_weights_keep_values_sharing_and_logits(llama_dir, tmp_path, monkeypatch, kind):
    if kind == "q8_0" and _C.quant_kernel() == "portable":
        pytest.skip("quantization='auto' keeps blocks only on CPUs with AVX2 or AVX-512 VNNI")
    path = llama_dir if kind == "float" else write_gguf(llama_dir, str(tmp_path / "q.gguf"),
                                                        qtype=gguf.GGMLQuantizationType.Q8_0)
    quant = "none" if kind == "float" else "auto"
    packed, plain = loader.load_model(path, quantization=quant), _unpacked(path, monkeypatch, quantization=quant)
    assert _one_run(packed) and not _one_run(plain)
    for (n, a), (_, b) in zip(packed.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), n
    attn = packed.model.layers[0].self_attn
    fused = attn.qkv[0]
    q_span, fused_span = tensor_span(attn.q_proj.weight), tensor_span(fused)
    assert fused_span[0] <= q_span[0] and q_span[1] <= fused_span[1]   # the projection is still a view
    if kind == "q8_0":
        assert isinstance(fused, QuantizedMatrix) and packed.model.embed_tokens.weight.format == "q8_0"
    assert weight_bytes(packed) == weight_bytes(plain)
    prompts, cont = [[5, 6, 7, 8], [40, 41]], [[9, 10, 11], [42, 43, 44]]
    for a, b in zip(paged_logits(packed, prompts, cont, 4, native=True), paged_logits(plain, prompts, cont, 4,
                                                                                        native=True)):
        assert torch.equal(a, b)


def test_a_tied_embedding_stays_tied(qwen_dir):
    model = loader.load_model(qwen_dir, compact_weights=False)
    assert model.lm_head.weight is model.model.embed_tokens.weight and _one_run(model)


def test_a_draft_leaves_its_targets_shared_embedding_where_it_is(llama_dir, tmp_path):
    target = loader.load_model(llama_dir)
    emb = target.model.embed_tokens.weight
    before = (emb.data_ptr(), emb.clone())
    draft = load_draft_model(shared_draft_model(llama_dir, str(tmp_path / "d")), target)
    assert draft.model.embed_tokens.weight is emb and emb.data_ptr() == before[0] and torch.equal(emb, before[1])
    assert not any(tensor_span(t) == tensor_span(emb) for t in weight_tensors(draft) if t is not emb)


def test_pack_weights_moves_each_storage_once():
    lin = torch.nn.Linear(64, 48)
    tied = torch.nn.Module()
    tied.a, tied.b = lin, torch.nn.Linear(64, 48)
    tied.b.weight = lin.weight   # the same parameter twice
    tied.pair = (lin.weight[:16], lin.bias)   # views kept as a plain attribute
    want = {n: p.clone() for n, p in tied.named_parameters()}
    moved = pack_weights(tied)
    assert moved == 48 * 64 * 4 + 48 * 4 + 48 * 4   # the shared weight, two biases (64-byte multiples)
    assert tied.b.weight is lin.weight and torch.equal(tied.pair[0], lin.weight[:16])
    assert tied.pair[0].data_ptr() == lin.weight.data_ptr()
    for n, p in tied.named_parameters():
        assert torch.equal(p, want[n]), n


def test_huge_page_buffers_are_aligned_and_obey_their_switch(monkeypatch):
    buf = huge_page_empty(3 * HUGE_PAGE + 5)
    assert buf.numel() == 3 * HUGE_PAGE + 5 and buf.data_ptr() % HUGE_PAGE == 0
    assert huge_page_empty(100).numel() == 100
    z = huge_page_zeros((2, 1 << 18, 3), torch.bfloat16)
    assert z.shape == (2, 1 << 18, 3) and z.dtype == torch.bfloat16 and not z.any() and z.is_contiguous()
    assert not _C.advise_huge_pages(buf.data_ptr(), HUGE_PAGE - 1)   # no whole huge page in it
    monkeypatch.setenv("SONARSPEC_NO_HUGE_PAGES", "1")
    assert not _C.advise_huge_pages(buf.data_ptr(), 2 * HUGE_PAGE)
    monkeypatch.setenv("SONARSPEC_NO_HUGE_PAGES", "0")
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    if os.path.exists(thp) and "[never]" not in open(thp).read():
        assert _C.advise_huge_pages(buf.data_ptr(), 2 * HUGE_PAGE)


def _resident_mib() -> float:
    with open("/proc/self/status") as fh:
        return int(fh.read().split("VmRSS:")[1].split()[0]) / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the resident set from /proc")
def test_cpu_kv_pools_are_zeroed_huge_page_buffers_resident_as_used(llama_dir):
    """A 256 MiB pair of pools costs (almost) no resident memory until slots are written;
    every slot reads as zero; the pools start on 2 MiB boundaries."""
    cfg = loader.ModelConfig.from_dir(llama_dir)   # 2 layers x 2 KV heads x 16 dims
    pages = (128 << 20) // (cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2 * 16)
    before = _resident_mib()
    cache = KVCache(cfg, pages, 16, torch.bfloat16, "cpu")
    assert cache.k.numel() * 2 >= 127 << 20 and _resident_mib() - before < 32
    cache.k[0, :100] = 1.0
    assert _resident_mib() - before < 32   # a few slots: a page or two
    assert cache.k.data_ptr() % HUGE_PAGE == 0 and cache.v.data_ptr() % HUGE_PAGE == 0
    assert cache.k[0, :100].eq(1).all() and not cache.k[0, 100:].any() and not cache.v.any()
    assert cache.k.shape == cache.v.shape


def test_a_packed_mtp_head_saves_and_loads_back_equal(llama_dir, heads, tmp_path):
    """Heads are packed too (their weights in one arena, the draft vocabulary ids left out);
    saving one writes each tensor on its own and reading it back gives the same weights."""
    target = loader.load_model(llama_dir)
    head = load_mtp_head(heads["trained"], target)
    assert _one_run(head)
    head.set_draft_vocab(torch.arange(0, 256, 2))
    save_mtp_head(head, str(tmp_path / "again"))
    back = load_mtp_head(str(tmp_path / "again"), target)
    assert torch.equal(back.draft_vocab, head.draft_vocab)
    for (n, a), (_, b) in zip(head.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), n


def test_the_layout_and_memory_tools_run_on_a_block_format_file(llama_dir, tmp_path):
    """tools/bench_weight_layout.py (three layouts, replies asserted equal inside) and
    tools/memory_footprint.py end to end on a tiny Q8_0 file: their JSON says what they measured."""
    if _C.quant_kernel() == "portable":
        pytest.skip("quantization='auto' keeps blocks only on CPUs with AVX2 or AVX-512 VNNI")
    path = write_gguf(llama_dir, str(tmp_path / "t.gguf"), qtype=gguf.GGMLQuantizationType.Q8_0, chat_template=CHATML)
    tools = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")
    layout, memory = str(tmp_path / "layout.json"), str(tmp_path / "memory.json")
    for cmd in (["bench_weight_layout.py", "--model", path, "--contexts", "8", "40", "--rounds", "2",
                 "--chat-rounds", "1", "--json", layout],
                ["memory_footprint.py", "--model", path, "--json", memory]):
        r = subprocess.run([sys.executable, os.path.join(tools, cmd[0]), *cmd[1:]], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
    rows = json.load(open(layout))
    assert [(x["context"], x["layout"]) for x in rows["rows"]] == [
        (c, n) for c in (8, 40) for n in ("separate", "arena", "huge pages")]
    assert all(x["step_us"] > 0 for x in rows["rows"]) and {x["layout"] for x in rows["chat"]} == {
        "separate", "arena", "huge pages"}
    mem = json.load(open(memory))
    assert mem["target"]["blocks"] > 0 and mem["target"]["float_embedding"] == 0   # the embedding is blocks too
    assert mem["kv_pool_mib"] > 0 and mem["resident_after_load_mib"] > mem["resident_before_load_mib"]


def test_memory_reports_weights_and_pools(llama_dir, heads, monkeypatch):
    """LLM.memory: the target's weights (each storage once, as a load without packing holds
    them), the drafter's own besides, and the KV pools of both with the tokens they hold."""
    plain = _unpacked(llama_dir, monkeypatch)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in weight_tensors(plain)}
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=heads["trained"]))
    m = llm.memory()
    assert m["target_weight_bytes"] == sum(storages.values())
    head = llm.engine.proposer.runner.model
    assert 0 < m["drafter_weight_bytes"] < m["target_weight_bytes"]
    assert m["drafter_weight_bytes"] <= sum(p.numel() * p.element_size() for p in head.parameters())
    pools = [t for r in llm.engine.runners() for t in (r.kv_cache.k, r.kv_cache.v)]
    assert len(pools) == 4 and m["kv_pool_bytes"] == sum(t.numel() * t.element_size() for t in pools)
    assert m["kv_pool_tokens"] == llm.engine.kv_cache.num_pages * llm.engine.kv_cache.page_size
    assert LLM(llama_dir).memory()["drafter_weight_bytes"] == 0


def test_the_gemm_benchmark_places_its_matrices_on_one_huge_page_buffer_unchanged():
    """tools/bench_quant_gemm.py's --pages huge: every matrix (block formats and bfloat16)
    copied into one buffer, each on a cache-line boundary, giving the GEMM the same bits;
    --pages heap: the matrices as they were."""
    import numpy as np
    from helpers.tools import import_tool
    from sonarspec_ext.ops.linear import kernel_linear
    bench = import_tool("bench_quant_gemm")
    rng = np.random.default_rng(3)
    for fmt in ("q4_1", "q6_k", "bf16"):
        ws, _ = bench.matrices(fmt, 256, 0, rng)
        if fmt == "q4_1":   # an odd size too: the next matrix must still start on a cache line
            ws.append(bench.matrices(fmt, 96, 0, rng)[0][0])
        huge = bench.placed(ws, "huge")
        assert bench.placed(ws, "heap") is ws
        starts = [w.data_ptr() for w in huge]
        assert all(p % 64 == 0 for p in starts) and len(set(starts)) == len(ws)
        base = min(starts)
        assert max(starts) - base < sum(w.nbytes if fmt != "bf16" else w.numel() * 2 for w in ws) + 64 * len(ws)
        for w, h in zip(ws, huge):
            assert h.shape == w.shape and h is not w
            x = torch.randn(3, w.shape[1])
            # random blocks hold NaN / infinite scales: those columns must agree as NaN too
            torch.testing.assert_close(kernel_linear(x, h), kernel_linear(x, w), rtol=0, atol=0, equal_nan=True)
