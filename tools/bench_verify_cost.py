#!/usr/bin/env python
"""Cost of a target forward over T tokens of one sequence (a verification pass over
1 + K tokens) relative to a one-token decode forward; interleaved rounds, medians. The
packaged target by default; ``--synthetic-200m`` adds a random 200M-parameter Llama
(bfloat16 weights, 400 MB: far beyond a CPU's caches, as an LLM's are) measured in the
same run. CPU float32 activations by default; ``--device cuda --dtype bfloat16`` on a GPU.

    python tools/bench_verify_cost.py [--json PATH] [--context 100 [400 1024]] [--model DIR] [--synthetic-200m]
                                      [--device cpu|cuda] [--dtype float32|bfloat16] [--prefetch near far none]

``--prefetch`` times every forward under each weight prefetch mode of the VDPBF16PS and block GEMMs
(``_C.set_weight_prefetch``; the same results), interleaved in the same rounds.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

from sonarspec_ext import LLM, _C
from sonarspec_ext.bench import SYNTHETIC_200M, cpu_info, make_synthetic_model, median_us, rotated, write_json
from sonarspec_ext.params import QUANTIZATION_CHOICES

SIZES = (1, 2, 3, 4, 5, 8, 17)


def forward_calls(model_dir: str, contexts, device: str, dtype: str, quantization: str = "none"):
    """One target forward over T tokens at positions context.. of one sequence, per
    (context, T) (on a GPU each call waits for the device)."""
    runner = LLM(model_dir, device=device, dtype=dtype, quantization=quantization).engine.runner
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    calls = {}
    for context in contexts:
        pages = (context + max(SIZES)) // runner.kv_cache.page_size + 1
        if pages > runner.kv_cache.num_pages:
            raise SystemExit(f"--context {context} needs {pages} KV pages; the cache holds {runner.kv_cache.num_pages}")
        table = list(range(pages))
        for T in SIZES:
            meta, pos = runner.metadata([(context, T, table)])
            ids, rows = torch.randint(0, 1000, (T,), device=runner.device), torch.arange(T, device=runner.device)

            def call(ids=ids, pos=pos, meta=meta, rows=rows):
                runner.forward(ids, pos, meta, rows)
                sync()
            calls[(context, T)] = call
    params = runner.model.config.num_params   # the checkpoint's, however its matrices are stored
    return calls, params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--context", type=int, nargs="+", default=[100],
                    help="tokens already in the sequence's KV cache (several: each measured)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="default", help="HF model directory, or 'default' (the packaged target)")
    ap.add_argument("--synthetic-200m", action="store_true", help="also a random 200M-parameter Llama")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--quantization", default="none", choices=QUANTIZATION_CHOICES,
                    help="weights of --model (default none: float weights; auto: a GGUF file's own blocks)")
    ap.add_argument("--prefetch", nargs="+", choices=["near", "far", "none"], default=None,
                    help="weight prefetch modes of the CPU GEMMs to compare (default: this CPU's)")
    args = ap.parse_args()
    modes = args.prefetch or [_C.weight_prefetch()]
    models = {args.model: forward_calls(args.model, args.context, args.device, args.dtype, args.quantization)}
    tmp = None
    if args.synthetic_200m:
        tmp = tempfile.TemporaryDirectory()
        models["synthetic-200m"] = forward_calls(make_synthetic_model(tmp.name, shape=SYNTHETIC_200M,
                                                                      dtype="bfloat16"), args.context,
                                                 args.device, args.dtype)
    keys = [(m, c, T) for m in modes for c in args.context for T in SIZES]
    times = {(name, key): [] for name in models for key in keys}
    for r in range(args.rounds):
        for name, (calls, _) in models.items():
            reps = 10 if name == args.model else 3
            for key in rotated(keys, r):
                _C.set_weight_prefetch(key[0])
                times[(name, key)].append(median_us(calls[key[1:]], reps, 2))
    results = []
    for name, (_, params) in models.items():
        print(f"{name} ({params / 1e6:.1f}M parameters)")
        for m in modes:
            for c in args.context:
                base = statistics.median(times[(name, (m, c, 1))])
                print(f"  context {c}" + (f", prefetch {m}" if args.prefetch else ""))
                for T in SIZES:
                    us = statistics.median(times[(name, (m, c, T))])
                    print(f"    {T:3d} tokens: {us:9.1f} us  {us / base:.2f}x a decode forward")
                    results.append({"model": name, "params": params, "context": c, "tokens": T, "prefetch": m,
                                    "forward_us": round(us, 1), "vs_decode": round(us / base, 3)})
    if args.json:
        write_json({"context": args.context, "threads": torch.get_num_threads(), "cpu": cpu_info(),
                    "device": args.device, "dtype": args.dtype, "quantization": args.quantization,
                    "results": results}, args.json)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
