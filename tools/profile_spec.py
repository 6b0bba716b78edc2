#!/usr/bin/env python
"""Where a speculative step's time goes, on the packaged models (batch 1, greedy):
the engine's time split per step for each scheme, and the time per call by shape (rows,
out, in, bfloat16 weights) of the native GEMMs that run as calls of their own inside the
engine - the lm_heads of the per-op path (the decoder stack and native drafting run
their GEMMs inside one native call each, not seen here).

    python tools/profile_spec.py [--schemes plain mtp:3 draft_target:4] [--max-tokens 96]
"""
from __future__ import annotations

import argparse
import collections
import time

import torch

import sonarspec_ext.ops.linear as linear_ops
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.bench_spec import PROMPTS


class _TimedC:
    """Stands in for the extension module inside ops.linear and times small_gemm calls."""

    def __init__(self, real):
        self.real, self.total, self.calls = real, collections.defaultdict(float), collections.Counter()

    def __getattr__(self, name):
        return getattr(self.real, name)

    def small_gemm(self, x, w, b, y, m, n, k, threads, bf16):
        t0 = time.perf_counter()
        self.real.small_gemm(x, w, b, y, m, n, k, threads, bf16)
        key = (m, n, k, bf16)
        self.total[key] += time.perf_counter() - t0
        self.calls[key] += 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", nargs="+", default=["plain", "mtp:3", "draft_target:4"])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    timed = _TimedC(linear_ops._C)
    for scheme in args.schemes:
        method, _, k = scheme.partition(":")
        spec = SpecConfig() if method == "plain" else SpecConfig(method=method, num_draft_tokens=int(k or 4))
        llm = LLM("default", spec=spec)
        llm.generate(PROMPTS[:2], params)   # warm-up
        eng = llm.engine
        eng.timing = dict.fromkeys(eng.timing, 0.0)
        eng.num_steps, eng.finished_stats = 0, []
        linear_ops._C, timed.total, timed.calls = timed, collections.defaultdict(float), collections.Counter()
        t0 = time.perf_counter()
        for p in PROMPTS:
            llm.generate([p], params)
        wall = time.perf_counter() - t0
        linear_ops._C = timed.real
        n = eng.num_steps
        split = " ".join(f"{key} {v / n * 1e3:.2f}" for key, v in eng.timing.items())
        print(f"{scheme:16s} {len(PROMPTS) * args.max_tokens / wall:7.1f} tok/s  {wall / n * 1e3:.2f} ms/step  "
              f"tau {llm.stats()['acceptance_length']:.2f}  per step (ms): {split}")
        for key in sorted(timed.total, key=lambda q: -timed.total[q])[:6]:
            m, nn, kk, bf16 = key
            us = timed.total[key] / timed.calls[key] * 1e6
            gbs = nn * kk * (2 if bf16 else 4) / us / 1e3
            print(f"    gemm rows {m:2d} out {nn:5d} in {kk:4d} {'bf16' if bf16 else 'fp32'}: {timed.calls[key]:5d} calls, "
                  f"{us:7.1f} us/call, {gbs:5.1f} GB/s of weights")


if __name__ == "__main__":
    main()
