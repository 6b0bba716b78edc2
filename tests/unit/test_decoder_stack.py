"""The native decoder stack (``ops.DecoderStack``) against the per-op path it replaces:
the same kernels in the same order, so hidden states and the K/V written to the pools must
be equal bit for bit - across architectures (Llama, Qwen2 q/k/v biases, Mistral sliding
window), float32, bfloat16 and block-quantized weights, several sequences with cached context, draft-tree
blocks and MTP heads of both layouts."""
import numpy as np
import pytest
import torch

from helpers.models import make_hf_model
from helpers.mtp_fixtures import random_head
from sonarspec_ext.runtime.kv_cache import KVCache
from sonarspec_ext.runtime.metadata import TreeBlock, build_metadata
from sonarspec_ext.runtime.native_stack import build_native_stack, run_native_stack
from sonarspec_ext.layers.attention import TorchPagedAttention
from sonarspec_ext.models.loader import load_model
from sonarspec_ext.ops.decoder_stack import DecoderStack, LayerTensors, ModelTensors
from sonarspec_ext.ops.linear import native_gemm_threads

PAGE = 4


def _cache(cfg, g, dtype=torch.float32):
    kv = KVCache(cfg, num_pages=40, page_size=PAGE, dtype=dtype, device="cpu")
    kv.k.copy_(torch.randn(kv.k.shape, generator=g))
    kv.v.copy_(torch.randn(kv.v.shape, generator=g))
    return kv


def _rows(num_query, contexts):
    """(start, num_query, page table) per sequence; tables interleave the pages."""
    rows = []
    for i, (n, ctx) in enumerate(zip(num_query, contexts)):
        pages = (ctx + n + PAGE - 1) // PAGE
        rows.append((ctx, n, [i + len(contexts) * p for p in range(pages)]))
    return rows


def _both_paths(model, cfg, meta, positions, inputs, g, kv_dtype=torch.float32, **kw):
    """Runs ``model`` once through the stack and once layer by layer on equal caches."""
    kv_a = _cache(cfg, g, kv_dtype)
    kv_b = KVCache(cfg, num_pages=40, page_size=PAGE, dtype=kv_dtype, device="cpu")
    kv_b.k.copy_(kv_a.k)
    kv_b.v.copy_(kv_a.v)
    stack = build_native_stack(model, kv_a)
    assert stack is not None
    with torch.inference_mode(), native_gemm_threads():
        native = run_native_stack(stack, model, inputs, positions, meta, kw.get("features"))
        assert native is not None, "the stack did not run the step"
        outs = [native, model(inputs, positions, TorchPagedAttention(kv_b, meta), **kw)]
    return outs, [kv_a, kv_b]


@pytest.mark.parametrize("arch,weights", [("llama", "bfloat16"), ("llama", "float32"), ("qwen2", "bfloat16"),
                                          ("mistral", "float32"), ("llama", "q8_0"), ("qwen2", "q4_1"),
                                          ("mistral", "q4_0")])
@pytest.mark.parametrize("num_query", [[1], [3, 1, 5], [8], [40, 2]])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_stack_equals_the_per_op_path(tmp_path, arch, weights, num_query, kv_dtype):
    """Bit for bit, outputs and the KV pools written (16-bit pools: the stack's rounding of
    new keys and values is torch's)."""
    extra = {"sliding_window": 6} if arch == "mistral" else {}
    hf = make_hf_model(str(tmp_path / "m"), arch, seed=3, num_key_value_heads=1 if arch == "qwen2" else 2, **extra)
    if weights == "bfloat16":
        hf.to(torch.bfloat16).save_pretrained(str(tmp_path / "m"), safe_serialization=True)
    quantization = weights if weights.startswith("q") else "none"
    model = load_model(str(tmp_path / "m"), quantization=quantization)
    cfg = model.config
    rows = _rows(num_query, [5 * i + 3 for i in range(len(num_query))])
    meta, positions = build_metadata(rows, PAGE, "cpu", extra.get("sliding_window"), native_attention=True)
    total = sum(num_query)
    if total > (8 if weights == "float32" else 64):
        assert build_native_stack(model, _cache(cfg, torch.Generator())).accepts(torch.zeros(total, cfg.hidden_size)) is False
        return
    g = torch.Generator().manual_seed(total)
    ids = torch.randint(0, cfg.vocab_size, (total,), generator=g)
    (a, b), (kv_a, kv_b) = _both_paths(model, cfg, meta, positions, ids, g, kv_dtype)
    assert torch.equal(a, b)
    assert torch.equal(kv_a.k, kv_b.k) and torch.equal(kv_a.v, kv_b.v)
    assert torch.isfinite(a).all() and a.abs().sum() > 0


def _tree_meta(prefix):
    # root + 5 nodes: parents -1, 0, 0, 1, 1, 3 -> ancestor bits
    parents = [-1, 0, 0, 1, 1, 3]
    bits, depth = [], []
    for i, p in enumerate(parents):
        b, d, j = 1 << i, 0, p
        while j >= 0:
            b, d, j = b | (1 << j), d + 1, parents[j]
        bits.append(b)
        depth.append(d)
    tree = TreeBlock(begin=prefix, bits=np.array(bits, dtype=np.int64),
                     positions=np.array([prefix + d for d in depth], dtype=np.int64))
    rows = [(prefix, len(parents), list(range((prefix + len(parents)) // PAGE + 1)))]
    return build_metadata(rows, PAGE, "cpu", trees=[tree], native_attention=True)


@pytest.mark.parametrize("layout", ["rmsnorm", "eagle1"])
def test_mtp_head_stack_equals_the_per_op_path_with_a_tree_block(llama_dir, layout):
    head = random_head(llama_dir, layout, seed=2)
    head.eval().requires_grad_(False)
    head.fuse_projections()
    cfg = head.config
    meta, positions = _tree_meta(prefix=9)
    n = positions.shape[0]
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=g)
    feats = torch.randn(n, cfg.hidden_size, generator=g)
    (a, b), (kv_a, kv_b) = _both_paths(head, cfg, meta, positions, ids, g, features=feats)
    assert torch.equal(a, b)
    assert torch.equal(kv_a.k, kv_b.k) and torch.equal(kv_a.v, kv_b.v)


def test_stack_refuses_what_it_cannot_run(tmp_path):
    make_hf_model(str(tmp_path / "m"), "llama", seed=4)
    model = load_model(str(tmp_path / "m"))
    cfg = model.config
    kv = _cache(cfg, torch.Generator())
    stack = build_native_stack(model, kv)
    assert stack.max_rows == 8 and stack.accepts(torch.zeros(8, cfg.hidden_size))
    assert not stack.accepts(torch.zeros(9, cfg.hidden_size))
    assert not stack.accepts(torch.zeros(2, cfg.hidden_size, dtype=torch.float64))
    with pytest.raises(ValueError, match="DecoderStack runs float32 CPU inputs"):
        stack.forward(torch.zeros(9, cfg.hidden_size), *([None] * 7))
    meta, _ = build_metadata(_rows([2], [3]), PAGE, "cpu", native_attention=True)
    far = torch.tensor([3, cfg.max_position_embeddings])
    with pytest.raises(ValueError, match="outside the RoPE tables"):
        stack.forward(torch.zeros(2, cfg.hidden_size), far, meta.slot_mapping, meta.block_table, PAGE, *meta.native)
    with pytest.raises(ValueError, match="positions must be a contiguous int64"):
        stack.forward(torch.zeros(2, cfg.hidden_size), far.int(), meta.slot_mapping, meta.block_table, PAGE,
                      *meta.native)
    layer = model.model.layers[0]
    t = LayerTensors(layer.input_layernorm.weight, layer.post_attention_layernorm.weight, layer.self_attn.qkv[0],
                     None, layer.self_attn.o_proj.weight, layer.mlp.gate_up[0], layer.mlp.down_proj.weight,
                     *kv.layer(0))
    rope = ModelTensors(model.rotary.cos, model.rotary.sin)
    with pytest.raises(ValueError, match=r"layer 0 qkv has shape \[128, 64\], expected \[144, 64\]"):
        DecoderStack([t], rope, cfg.num_attention_heads + 1, cfg.num_key_value_heads, 1e-5)
    with pytest.raises(ValueError, match="dtype"):
        DecoderStack([LayerTensors(**{**t.__dict__, "k_pool": kv.k[0].double()})], rope, cfg.num_attention_heads,
                     cfg.num_key_value_heads, 1e-5)
    with pytest.raises(ValueError, match="cos table has shape"):
        DecoderStack([t], ModelTensors(model.rotary.cos[:, :3].contiguous(), model.rotary.sin), cfg.num_attention_heads,
                     cfg.num_key_value_heads, 1e-5)
    with pytest.raises(ValueError, match="fc has shape"):
        DecoderStack([t], ModelTensors(model.rotary.cos, model.rotary.sin, fc=t.o), cfg.num_attention_heads,
                     cfg.num_key_value_heads, 1e-5)
    with pytest.raises(ValueError, match="at least one layer"):
        DecoderStack([], rope, 4, 2, 1e-5)
    # Separate q, k and v (a GGUF file's mixed formats) run as three GEMMs, to the same bits;
    # an unfused gate and up (training modules) run op by op.
    unfused = load_model(str(tmp_path / "m"))
    for layer in unfused.model.layers:
        layer.self_attn.qkv = None
    x = torch.randn(2, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    step = (torch.tensor([3, 4]), meta.slot_mapping, meta.block_table, PAGE, *meta.native)
    assert torch.equal(build_native_stack(unfused, kv).forward(x, *step), stack.forward(x, *step))
    for layer in unfused.model.layers:
        layer.mlp.gate_up = None
    assert build_native_stack(unfused, kv) is None
    # A bfloat16 model (SDPA attention, no native metadata) has none either.
    assert build_native_stack(load_model(str(tmp_path / "m"), dtype="bfloat16"), kv) is None


def test_an_mtp_stack_needs_features(llama_dir):
    head = random_head(llama_dir, "rmsnorm")
    head.eval().requires_grad_(False)
    head.fuse_projections()
    kv = _cache(head.config, torch.Generator())
    stack = build_native_stack(head, kv)
    meta, positions = build_metadata(_rows([1], [3]), PAGE, "cpu", native_attention=True)
    with pytest.raises(ValueError, match="pass features"):
        stack.forward(torch.zeros(1, head.config.hidden_size), positions, meta.slot_mapping, meta.block_table, PAGE,
                      *meta.native)


@pytest.mark.parametrize("weights", ["float32", "q8_0"])
@pytest.mark.parametrize("num_query", [[3, 1], [40, 30]])   # one call, and slices of max_rows
def test_captured_streams_are_the_per_op_paths_residual_streams(tmp_path, weights, num_query):
    """The streams after the captured layers, in the order asked for, equal each per-op
    layer's output (read by forward hooks; bit for bit where the per-op path runs the same
    kernels, within float rounding for steps beyond the native rows); capturing leaves the
    final states as they were; the per-op path's own capture agrees; a layer past the
    stack is refused."""
    make_hf_model(str(tmp_path / "m"), "llama", seed=5, num_hidden_layers=3)
    model = load_model(str(tmp_path / "m"), quantization="none" if weights == "float32" else weights)
    cfg = model.config
    meta, positions = build_metadata(_rows(num_query, [4, 9]), PAGE, "cpu", native_attention=True)
    ids = torch.randint(0, cfg.vocab_size, (sum(num_query),), generator=torch.Generator().manual_seed(1))
    caches = [_cache(cfg, torch.Generator().manual_seed(2)) for _ in range(4)]   # equal contents
    outs = {}
    hooks = [layer.register_forward_hook(lambda m, i, o, n=n: outs.__setitem__(n, o.clone()))
             for n, layer in enumerate(model.model.layers)]
    with torch.inference_mode(), native_gemm_threads():
        final = model(ids, positions, TorchPagedAttention(caches[0], meta))
        for h in hooks:
            h.remove()
        stack = build_native_stack(model, caches[1])
        plain = run_native_stack(stack, model, ids, positions, meta)
        got_final, got = run_native_stack(build_native_stack(model, caches[2]), model, ids, positions, meta,
                                          capture=(2, 0))
        per_op = model(ids, positions, TorchPagedAttention(caches[3], meta), capture=(2, 0))
        with pytest.raises(ValueError, match=r"must lie in \[0, 3\)"):
            run_native_stack(stack, model, ids, positions, meta, capture=(3,))
        with pytest.raises(ValueError, match=r"must lie in \[0, 3\)"):
            model(ids, positions, TorchPagedAttention(caches[3], meta), capture=(3,))
    assert torch.equal(got_final, plain)
    assert torch.equal(per_op[0], final) and torch.equal(per_op[1], torch.stack([outs[2], outs[0]], dim=1))
    if sum(num_query) <= stack.max_rows:
        assert torch.equal(got, per_op[1]) and torch.equal(got_final, final)
    else:
        tol = 1e-4 if weights == "float32" else 3e-2   # q8_0 beyond the native rows: float, not int8, activations
        torch.testing.assert_close(got, per_op[1], rtol=tol, atol=tol)
