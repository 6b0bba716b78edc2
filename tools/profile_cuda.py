#!/usr/bin/env python
"""Where a step's time goes on a CUDA device (packaged models, batch 1, greedy): per
scheme, under torch's profiler, the wall time per output token and per engine step, the
kernel launches per step, the GPU's busy time per step (sum of kernel durations; the
rest of the wall time the GPU waits for the host), the engine's own time split, and the
operators with the most host time.

    python tools/profile_cuda.py [--schemes plain draft_target:4 mtp:3] [--dtype bfloat16] [--cuda-graphs]
                                 [--json PATH]
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from sonarspec_ext import LLM, SamplingParams
from sonarspec_ext.bench import write_json
from sonarspec_ext.bench.spec import PROMPTS, scheme_config


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def profile_scheme(name: str, device: str, dtype: str, max_tokens: int, top: int, num_prompts: int,
                   cuda_graphs: bool = False) -> dict:
    llm = LLM("default", spec=scheme_config(name), device=device, dtype=dtype, cuda_graphs=cuda_graphs,
              enable_prefix_caching=False)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for p in PROMPTS[:2]:
        llm.generate([p], params)                       # warm-up: allocator, kernels, planner thread
    llm.engine.finished.clear()
    llm.engine.timing = dict.fromkeys(llm.engine.timing, 0.0)
    _sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for p in PROMPTS[:num_prompts]:
            llm.generate([p], params)
        _sync(device)
        wall = time.perf_counter() - t0
    s = llm.stats()
    steps, tokens = s["num_engine_steps"], num_prompts * max_tokens
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                                                         "cuLaunchKernelEx"))
    gpu_us = sum(getattr(e, "self_device_time_total", 0) for e in events if e.device_type.name == "CUDA")
    syncs = sum(e.count for e in events if "Synchronize" in e.key or e.key == "cudaMemcpyAsync")
    ops = sorted((e for e in events if e.key.startswith("aten::") or "::" in e.key),
                 key=lambda e: -e.self_cpu_time_total)[:top]
    return {"scheme": name, "tok_s": round(tokens / wall, 1), "us_per_token": round(wall / tokens * 1e6, 1),
            "us_per_step": round(wall / steps * 1e6, 1), "tau": round(s["acceptance_length"], 3),
            "launches_per_step": round(launches / steps, 1), "gpu_busy_us_per_step": round(gpu_us / steps, 1),
            "syncs_and_copies_per_step": round(syncs / steps, 2),
            "timing_per_step_us": {k: round(v / steps * 1e6, 1) for k, v in s["timing"].items()},
            "top_host_ops": [{"op": e.key, "calls_per_step": round(e.count / steps, 2),
                              "self_cpu_us_per_step": round(e.self_cpu_time_total / steps, 1)} for e in ops]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--schemes", nargs="+", default=["plain", "draft_target:4", "mtp:3"])
    ap.add_argument("--device", default="cuda", help="cuda (or cpu, for the host side alone)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--cuda-graphs", action="store_true", help="engine option cuda_graphs")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=3)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: try --device cpu")
    rows = [profile_scheme(n, args.device, args.dtype, args.max_tokens, args.top, args.num_prompts, args.cuda_graphs)
            for n in args.schemes]
    for r in rows:
        print(f"{r['scheme']:<16} {r['tok_s']:>8} tok/s  {r['us_per_step']:>8} us/step  tau {r['tau']:.2f}  "
              f"{r['launches_per_step']} launches/step  GPU busy {r['gpu_busy_us_per_step']} us/step  "
              f"syncs+copies {r['syncs_and_copies_per_step']}/step  split {r['timing_per_step_us']}")
        for o in r["top_host_ops"]:
            print(f"    {o['op']:<40} {o['calls_per_step']:>7} calls  {o['self_cpu_us_per_step']:>8} us/step")
    if args.json:
        write_json({"dtype": args.dtype, "cuda_graphs": args.cuda_graphs, "torch": torch.__version__,
                    "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                    "results": rows}, args.json)


if __name__ == "__main__":
    main()
