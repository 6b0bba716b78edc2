#!/usr/bin/env python
"""K-quant GGUF files beside llama.cpp: a random Llama-shaped model whose matrices are
multiples of 256 wide (``bench.SYNTHETIC_200M``'s layers with SmolLM2's tokenizer, so
llama.cpp loads it), written as F16 and converted by llama.cpp's own quantizer to Q4_K_M
(Q4_K with Q6_K for some v / down matrices and the output), Q5_K_M (the same with Q5_K) and
Q4_0; plain greedy decoding
at batch 1 for each file with sonarspec (``quantization="auto"``: K-quant blocks kept; and
"none": dequantized to bfloat16) and llama.cpp (llama-cpp-python), beside the bytes per
token and the read-bandwidth floor, in one run. Random weights: the speed is what counts
here, not the text (greedy agreement with llama.cpp is reported, not asserted).

    python tools/bench_k_quants.py [--work runs/k_quants] [--max-tokens 64] [--repeats 3] [--json PATH]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import gguf
import numpy as np
import torch

from sonarspec_ext import LLM, SamplingParams, _C
from sonarspec_ext.assets import resolve
from sonarspec_ext.bench import SYNTHETIC_200M, cpu_info, read_bandwidth_gbs, weight_bytes, write_json
from sonarspec_ext.bench.quantized import _llama_cpp
from sonarspec_ext.models.gguf import gguf_file
from sonarspec_ext.models.loader import quantized_formats

FTYPES = {"q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
          "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}


def write_random_f16(path: str, tokenizer_gguf: str, seed: int = 0) -> str:
    """SYNTHETIC_200M's layers (vocab: the tokenizer's) as an F16 GGUF, weights N(0, 0.02)."""
    src = gguf.GGUFReader(tokenizer_gguf)
    s = SYNTHETIC_200M
    vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    h, inter, heads, kv, hd = s["hidden_size"], s["intermediate_size"], s["num_attention_heads"], \
        s["num_key_value_heads"], s["head_dim"]
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(s["num_hidden_layers"])
    w.add_context_length(s["max_position_embeddings"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(hd)
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
        w.add_string(key, src.fields[key].contents())
    w.add_token_list(src.fields["tokenizer.ggml.tokens"].contents())
    w.add_token_types(src.fields["tokenizer.ggml.token_type"].contents())
    w.add_token_merges(src.fields["tokenizer.ggml.merges"].contents())
    w.add_bos_token_id(src.fields["tokenizer.ggml.bos_token_id"].contents())
    w.add_eos_token_id(src.fields["tokenizer.ggml.eos_token_id"].contents())
    rng = np.random.default_rng(seed)
    mat = lambda rows, cols: (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)  # noqa
    w.add_tensor("token_embd.weight", mat(vocab, h))
    w.add_tensor("output.weight", mat(vocab, h))
    w.add_tensor("output_norm.weight", np.ones(h, dtype=np.float32))
    for i in range(s["num_hidden_layers"]):
        for name, shape in (("attn_q", (heads * hd, h)), ("attn_k", (kv * hd, h)), ("attn_v", (kv * hd, h)),
                            ("attn_output", (h, heads * hd)), ("ffn_gate", (inter, h)), ("ffn_up", (inter, h)),
                            ("ffn_down", (h, inter))):
            w.add_tensor(f"blk.{i}.{name}.weight", mat(*shape))
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(h, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sonarspec_tok_s(path: str, quantization: str, prompts, max_tokens: int, repeats: int):
    llm = LLM(path, quantization=quantization, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = [o.token_ids for o in llm.generate(prompts, params)]   # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for p in prompts:
            llm.generate([p], params)
        times.append(time.perf_counter() - t0)
    formats = sorted(quantized_formats(llm.engine.model))
    return len(prompts) * max_tokens / statistics.median(times), weight_bytes(llm.engine.model), outs, formats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="runs/k_quants")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    threads = torch.get_num_threads()
    os.makedirs(args.work, exist_ok=True)
    f16 = os.path.join(args.work, "random-f16.gguf")
    if not os.path.isfile(f16):
        write_random_f16(f16 + ".tmp", gguf_file(resolve("smollm2", "target")))
        os.replace(f16 + ".tmp", f16)
    files = {}
    for name, ftype in FTYPES.items():
        out = os.path.join(args.work, f"random-{name}.gguf")
        if not os.path.isfile(out):
            _llama_cpp({"op": "quantize", "src": f16, "out": out, "ftype": ftype, "threads": threads}, args.work)
        files[name] = out
    rng = np.random.default_rng(1)
    prompts = [rng.integers(300, 40000, size=n).tolist() for n in (12, 30, 50, 21)]
    gbs = read_bandwidth_gbs()
    rows = []
    for name, path in files.items():
        row = {"file": name, "bytes": os.path.getsize(path)}
        for quant in ("auto", "none"):
            tok_s, wbytes, outs, formats = sonarspec_tok_s(path, quant, prompts, args.max_tokens, args.repeats)
            row[quant] = {"tok_s": round(tok_s, 1), "bytes_per_token": wbytes, "formats": formats,
                          "floor_tok_s": round(gbs * 1e9 / wbytes, 1)}
            if quant == "auto":
                ref = outs
        lc = _llama_cpp({"op": "decode", "path": path, "prompts": prompts, "max_tokens": args.max_tokens,
                         "repeats": args.repeats, "threads": threads}, args.work)
        row["llama_cpp_tok_s"] = lc["tok_s"]
        row["greedy_agreement_with_llama_cpp"] = f"{sum(a == b for a, b in zip(lc['tokens'], ref))}/{len(ref)}"
        row["auto_vs_llama_cpp"] = round(row["auto"]["tok_s"] / lc["tok_s"], 3)
        row["auto_vs_none"] = round(row["auto"]["tok_s"] / row["none"]["tok_s"], 3)
        rows.append(row)
        auto = row["auto"]
        print(f"{name}: sonarspec auto {auto['tok_s']} tok/s ({auto['bytes_per_token'] / 1e6:.0f} MB/token, "
              f"floor {row['auto']['floor_tok_s']}, formats {row['auto']['formats']}) | none {row['none']['tok_s']} | "
              f"llama.cpp {lc['tok_s']} | auto {row['auto_vs_llama_cpp']:.2f}x llama.cpp, {row['auto_vs_none']:.2f}x "
              f"none | greedy agreement {row['greedy_agreement_with_llama_cpp']}")
    if args.json:
        write_json({"shape": SYNTHETIC_200M, "threads": threads, "cpu": cpu_info(), "quant_kernel": _C.quant_kernel(),
                    "read_bandwidth_gbs": round(gbs, 2), "max_tokens": args.max_tokens, "repeats": args.repeats,
                    "num_prompts": len(prompts), "torch": torch.__version__, "results": rows}, args.json)


if __name__ == "__main__":
    main()
