"""GGUF files on block-quantized weights: sonarspec's plain and speculative decoding beside
llama.cpp (through ``llama-cpp-python``, when importable) on the same files, and bytes
streamed per token beside the read-bandwidth floor, in one process.

The files: the model's own GGUF, plus - with llama-cpp-python - Q4_K_M, Q8_0 and BF16
versions made by llama.cpp's own quantizer (``llama_model_quantize``) from it, so both engines read
the same bytes. sonarspec loads each with ``quantization="auto"`` (a BF16 file runs on its
bfloat16 kernels). Prompts: the held-out chat questions of ``bench.spec``, rendered with
the chat template, batch 1, greedy, ``max_tokens`` tokens each (end-of-sequence ignored
on both sides); llama.cpp's prompt-lookup speculation is its own speculative mode there.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Optional

import torch

from . import cpu_info, read_bandwidth_gbs, weight_bytes
from .. import _C
from .spec import bench_prompts, bench_spec
from ..assets import resolve
from ..llm import LLM
from ..models.gguf import gguf_file
from ..params import SamplingParams

LLAMA_FTYPES = {"q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
                "bf16": "LLAMA_FTYPE_MOSTLY_BF16"}


def _has_llama_cpp() -> bool:
    import importlib.util
    return importlib.util.find_spec("llama_cpp") is not None


def _llama_cpp(request: dict, tmp: str) -> dict:
    """Runs ``llama_cpp_worker.py`` on ``request`` in its own process."""
    req = os.path.join(tmp, "request.json")
    with open(req, "w") as fh:
        json.dump(request, fh)
    worker = os.path.join(os.path.dirname(__file__), "llama_cpp_worker.py")
    res = subprocess.run([sys.executable, worker, req], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"llama.cpp worker failed ({request['op']}): {res.stderr.strip()[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def bench_quantized(model: str = "smollm2", mtp: Optional[str] = None, max_tokens: int = 128, repeats: int = 3,
                    threads: Optional[int] = None, with_llama_cpp: bool = True, mtp_k: int = 2,
                    draft: Optional[str] = None, draft_k: int = 3, draft_quantization: str = "auto",
                    lookup_tokens: int = 0) -> dict:
    """``mtp`` / ``draft``: the MTP head (chains of ``mtp_k``, and with ``lookup_tokens`` those
    chains beside lookup drafts) and draft model (chains of ``draft_k``, weights per
    ``draft_quantization``) run on every file, beside n-grams."""
    if threads:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    src = gguf_file(resolve(model, "target"))
    if src is None:
        raise ValueError(f"{model}: the quantized benchmark takes a GGUF file")
    llama_cpp = with_llama_cpp and _has_llama_cpp()
    gbs = read_bandwidth_gbs()
    tmp = tempfile.TemporaryDirectory()
    files = {"file": src}
    if llama_cpp:   # the same bytes for both engines: llama.cpp's own quantizer makes the other files
        for ftype, name in LLAMA_FTYPES.items():
            out = os.path.join(tmp.name, f"{os.path.splitext(os.path.basename(src))[0]}.{ftype}.gguf")
            files[ftype] = _llama_cpp({"op": "quantize", "src": src, "out": out, "ftype": name,
                                       "threads": threads}, tmp.name)["path"]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    rows = []
    for name, path in files.items():
        llm = LLM(path, quantization="auto", enable_prefix_caching=False)
        prompts = bench_prompts(llm)
        wbytes = weight_bytes(llm.engine.model)
        ref = [o.token_ids for o in llm.generate(prompts, params)]
        del llm
        spec = bench_spec(path, draft=draft, ks=(draft_k,), batch_sizes=(1,), max_tokens=max_tokens, repeats=repeats,
                          with_transformers=False, mtp=mtp, mtp_ks=(mtp_k,) if mtp else (), with_ngram=True,
                          draft_quantization=draft_quantization, lookup_tokens=lookup_tokens)
        by = {r["scheme"]: r for r in spec["results"]}
        row = {"file": name, "path": os.path.basename(path), "bytes_per_token": wbytes,
               "floor_tok_s": round(gbs * 1e9 / wbytes, 1), "plain_tok_s": by["plain"]["tok_s"],
               "schemes": {k: {f: v[f] for f in ("tok_s", "speedup", "tau") if f in v} for k, v in by.items()}}
        row["floor_fraction"] = round(row["plain_tok_s"] / row["floor_tok_s"], 3)
        if llama_cpp:
            req = {"op": "decode", "path": path, "prompts": prompts, "max_tokens": max_tokens, "repeats": repeats,
                   "threads": threads}
            plain = _llama_cpp(req, tmp.name)
            lookup = _llama_cpp({**req, "prompt_lookup": True}, tmp.name)
            row["llama_cpp_tok_s"] = plain["tok_s"]
            row["llama_cpp_lookup_tok_s"] = lookup["tok_s"]
            row["llama_cpp_lookup_lossless"] = lookup["tokens"] == plain["tokens"]
            row["llama_cpp_greedy_agreement"] = f"{sum(a == b for a, b in zip(plain['tokens'], ref))}/{len(ref)}"
            best = max(v["tok_s"] for v in row["schemes"].values())
            row["plain_vs_llama_cpp"] = round(row["plain_tok_s"] / plain["tok_s"], 3)
            row["best_vs_llama_cpp"] = round(best / plain["tok_s"], 3)
            row["best_vs_llama_cpp_lookup"] = round(best / lookup["tok_s"], 3)
        rows.append(row)
        print(f"[{len(rows)}/{len(files)}] {name}: plain {row['plain_tok_s']:.1f} tok/s"
              + (f", llama.cpp {row['llama_cpp_tok_s']:.1f}" if llama_cpp else ""), file=sys.stderr, flush=True)
    tmp.cleanup()
    return {"model": src, "mtp": mtp, "draft": draft, "draft_quantization": draft_quantization,
            "lookup_draft_tokens": lookup_tokens,
            "max_tokens": max_tokens, "repeats": repeats, "threads": threads, "cpu": cpu_info(),
            "quant_kernel": _C.quant_kernel(), "weight_prefetch": _C.weight_prefetch(),
            "read_bandwidth_gbs": round(gbs, 2), "num_prompts": len(prompts),
            "llama_cpp": _llama_cpp_version() if llama_cpp else None, "torch": torch.__version__, "results": rows}


def _llama_cpp_version() -> str:
    import importlib.metadata
    return importlib.metadata.version("llama_cpp_python")


def print_quantized_table(info: dict) -> None:
    print(f"{info['model']}: batch 1, greedy, {info['num_prompts']} chat prompts x {info['max_tokens']} tokens, "
          f"{info['threads']} threads, read bandwidth {info['read_bandwidth_gbs']:.1f} GB/s, "
          f"{info.get('quant_kernel', '?')} kernel ({info.get('weight_prefetch', 'near')} prefetch), "
          f"median of {info['repeats']}")
    for r in info["results"]:
        line = (f"  {r['path']}: {r['bytes_per_token'] / 1e6:.1f} MB/token, floor {r['floor_tok_s']:.0f} tok/s | "
                f"plain {r['plain_tok_s']:.1f} ({r['floor_fraction']:.0%} of floor)")
        for k, v in r["schemes"].items():
            if k != "plain":
                line += f" | {k} {v['tok_s']:.1f} ({v['speedup']:.2f}x, tau {v['tau']:.2f})"
        if "llama_cpp_tok_s" in r:
            line += (f" | llama.cpp {r['llama_cpp_tok_s']:.1f}, prompt lookup {r['llama_cpp_lookup_tok_s']:.1f} | "
                     f"plain {r['plain_vs_llama_cpp']:.2f}x, best {r['best_vs_llama_cpp']:.2f}x llama.cpp")
        print(line)
