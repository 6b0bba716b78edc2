"""Decode-speed benchmark: sonarspec vs ``transformers`` generate on the same weights,
beside the memory-bandwidth floor (weight bytes read per token / read bandwidth measured
in the same run).

Agreement (identical greedy tokens, float32 weights on both sides) is asserted before
anything is timed; every figure is the median of several runs measured side by side in
one process.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from typing import List, Optional

import torch

from ..assets import resolve
from ..llm import LLM
from ..models.config import ModelConfig
from ..models.gguf import gguf_file
from ..models.llama import LlamaForCausalLM
from ..models.loader import save_model
from ..models.tokenizer import write_byte_tokenizer
from ..params import SamplingParams

SYNTHETIC_30M = dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                     num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                     max_position_embeddings=2048, tie_word_embeddings=True, eos_token_ids=[256])


# Weights (400 MB in bfloat16) far beyond a CPU's caches, as an LLM's are.
SYNTHETIC_200M = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                      num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                      max_position_embeddings=2048, tie_word_embeddings=False, eos_token_ids=[256])


# shapes of real models, for random-weight runs (load_format="dummy")
LLAMA31_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                  max_position_embeddings=8192, tie_word_embeddings=False, eos_token_ids=[256])
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, rope_theta=100000.0,
                    max_position_embeddings=8192, tie_word_embeddings=True, eos_token_ids=[256])


def synthetic_config_dir(path: str, shape: dict) -> str:
    """A model directory with ``shape``'s ``config.json`` and a byte tokenizer but no
    weights: for ``LLM(path, load_format="dummy")``."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(ModelConfig(**shape).to_hf_dict(), fh)
    write_byte_tokenizer(path)
    return path


def make_synthetic_model(path: str, seed: int = 0, shape: Optional[dict] = None, dtype: str = "float32") -> str:
    """A random Llama in HF format, ``shape`` (default: ``SYNTHETIC_30M``) config fields,
    weights scaled so greedy paths are stable, stored in ``dtype``."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(ModelConfig(**(shape or SYNTHETIC_30M)))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.05)
    save_model(model, path, dtype=dtype)
    write_byte_tokenizer(path)
    return path


def median_us(fn, reps: int, warmup: int = 1) -> float:
    """Median over five batches of ``reps`` calls of ``fn``, microseconds per call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(times)


def rotated(items, r: int) -> list:
    """``items`` from the (r mod n)-th on, then the rest: the order of interleaved timing
    round r, so that no item always runs first (or always after the same other one)."""
    items = list(items)
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def median_time(fn, repeats: int) -> float:
    """Median wall time (s) of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def read_bandwidth_gbs(mib: int = 1024, repeats: int = 5) -> float:
    """Memory read bandwidth (GB/s) of torch's threads: the median time of summing a
    buffer far larger than the caches (float32 sums are memory-bound)."""
    buf = torch.ones(mib << 18, dtype=torch.float32)
    buf.sum()
    t = median_time(buf.sum, repeats)
    return buf.numel() * 4 / t / 1e9


_CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def cpu_info() -> dict:
    """The machine a benchmark ran on, for its JSON: the CPU's vendor, model name, family
    and model numbers, the SIMD features the native kernels dispatch on (Linux's
    /proc/cpuinfo; elsewhere what ``platform`` says) and the logical CPUs."""
    info = {"model_name": platform.processor() or platform.machine(), "logical_cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as fh:
            first = fh.read().split("\n\n")[0]
    except OSError:
        return info
    fields = dict(line.split(":", 1) for line in first.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    info.update(vendor=fields.get("vendor_id"), model_name=fields.get("model name", info["model_name"]),
                family=fields.get("cpu family"), model=fields.get("model"),
                features=[f for f in _CPU_FLAGS if f in flags])
    return info


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes one decode step streams from memory: every weight once (fused and tied weights
    share memory), block-quantized matrices at their packed size - except an embedding table
    the lm_head does not share (a lookup reads one row of it)."""
    from ..models.weight_arena import tensor_span, union_bytes, weight_tensors
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    lm_head = getattr(getattr(model, "lm_head", None), "weight", None)
    lookup = tensor_span(embed.weight) if embed is not None and embed.weight is not lm_head else None
    return union_bytes(s for s in map(tensor_span, weight_tensors(model)) if s != lookup)


def load_transformers(path: str):
    """The transformers model of an HF directory or a GGUF file, in float32."""
    import os
    import transformers
    f = gguf_file(path)
    if f:
        d, name = os.path.split(f)
        return transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def bench_decode(model_dir: Optional[str] = None, batch_sizes: List[int] = (1, 8), prompt_len: int = 32,
                 max_tokens: int = 128, repeats: int = 5, threads: Optional[int] = None,
                 with_transformers: bool = True, quantization: str = "none") -> dict:
    if threads:
        torch.set_num_threads(threads)
    tmp = None
    if model_dir is None:
        tmp = tempfile.TemporaryDirectory()
        model_dir = make_synthetic_model(tmp.name)
    model_dir = resolve(model_dir, "target")
    llm = LLM(model_dir, quantization=quantization, enable_prefix_caching=False)
    # greedy agreement is checked with float32 weights, as transformers holds them
    exact = (LLM(model_dir, compact_weights=False, quantization="none", enable_prefix_caching=False)
             if with_transformers else None)
    hf = load_transformers(model_dir) if with_transformers else None
    gbs = read_bandwidth_gbs()
    wbytes = weight_bytes(llm.engine.model)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    g = torch.Generator().manual_seed(0)
    rows = []
    for bs in batch_sizes:
        prompts = torch.randint(0, 256, (bs, prompt_len), generator=g)
        ours = lambda: llm.generate(prompts.tolist(), params)  # noqa: E731
        ours()
        row = {"batch_size": bs, "prompt_len": prompt_len, "max_tokens": max_tokens}
        if hf is not None:
            out = exact.generate(prompts.tolist(), params)
            def theirs():
                with torch.no_grad():
                    return hf.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=max_tokens,
                                       min_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
            ref = theirs()[:, prompt_len:].tolist()
            agree = sum(o.token_ids == r for o, r in zip(out, ref))
            if bs == 1 and agree != 1:
                raise RuntimeError("sonarspec and transformers disagree on greedy tokens; not timing")
            row["greedy_agreement"] = f"{agree}/{bs}"
        t_ours = median_time(ours, repeats)
        row["sonarspec_tok_s"] = round(bs * max_tokens / t_ours, 1)
        if hf is not None:
            t_hf = median_time(theirs, repeats)
            row["transformers_tok_s"] = round(bs * max_tokens / t_hf, 1)
            row["speedup"] = round(t_hf / t_ours, 3)
        rows.append(row)
    floor = gbs * 1e9 / wbytes
    for row in rows:
        row["floor_fraction"] = round(row["sonarspec_tok_s"] / row["batch_size"] / floor, 3)
    info = {"model": "synthetic-30m" if tmp else model_dir, "num_params": llm.engine.model_config.num_params,
            "dtype": "float32", "threads": torch.get_num_threads(), "cpu": cpu_info(), "torch": torch.__version__,
            "weight_dtype": _weight_kind(llm.engine.model),
            "weight_bytes": wbytes, "read_bandwidth_gbs": round(gbs, 2), "floor_tok_s": round(floor, 1),
            "repeats": repeats, "results": rows}
    if tmp:
        tmp.cleanup()
    return info


def _weight_kind(model) -> str:
    from ..models.loader import quantized_formats
    formats = quantized_formats(model)
    if formats:
        return "+".join(sorted(formats))
    return str(model.model.layers[0].self_attn.qkv[0].dtype).replace("torch.", "")


def print_table(info: dict) -> None:
    print(f"model {info['model']} ({info['num_params'] / 1e6:.1f}M params, {info['dtype']}, "
          f"{info['threads']} threads, median of {info['repeats']})")
    print(f"  weights {info['weight_bytes'] / 1e6:.1f} MB per token, read bandwidth {info['read_bandwidth_gbs']:.1f} "
          f"GB/s -> floor {info['floor_tok_s']:.1f} tok/s per sequence")
    for r in info["results"]:
        line = (f"  batch {r['batch_size']:3d}: sonarspec {r['sonarspec_tok_s']:8.1f} tok/s "
                f"({r['floor_fraction']:.0%} of the floor per sequence)")
        if "transformers_tok_s" in r:
            line += (f" | transformers {r['transformers_tok_s']:8.1f} tok/s | speedup {r['speedup']:.2f}x"
                     f" | greedy agreement {r['greedy_agreement']}")
        print(line)


def write_json(info: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(info, fh, indent=2)
