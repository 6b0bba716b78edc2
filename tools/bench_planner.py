#!/usr/bin/env python
"""Planning one decode step - schedule plus attention metadata - with the native planner
(called from Python, conversions included) and with the pure-Python reference planner,
same workload, same run; median over steps. Then the engine on the packaged models with
the next step planned ahead on the planner's thread versus planned inside the step
(interleaved rounds): time per step, and the time spent waiting for the plan.

    python tools/bench_planner.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from sonarspec_ext import _C
from sonarspec_ext.bench import write_json
from sonarspec_ext.testing.reference_planner import ReferencePlanner, build_metadata_reference

PAGE = 16


def step_times(planner, build, num_seqs: int, context: int, steps: int) -> float:
    """Median time of schedule + build(planner, plan) over decode steps."""
    for i in range(num_seqs):
        planner.add_request(i, context)
    planner.schedule(4)
    times = []
    for _ in range(steps):
        for i in range(num_seqs):
            planner.append_tokens(i, 1)
        t0 = time.perf_counter()
        seqs = planner.schedule(4)[0]
        build(planner, seqs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def native_metadata(planner, seqs):
    ids, starts, nums = (np.fromiter((s[i] for s in seqs), dtype=np.int64, count=len(seqs)) for i in range(3))
    return planner.build_metadata(ids, starts, nums, None, 0, False)


def python_metadata(planner, seqs):
    return build_metadata_reference([(start, n, planner.page_table(sid)) for sid, start, n in seqs], PAGE, None,
                                    None, False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for ctx in [512] if args.quick else [128, 512, 2048]:
        for n in (1, 8, 64, 256, 1024):
            max_len = ctx + 200
            pages = n * (max_len // PAGE + 2)
            cfg = _C.PlannerConfig()
            cfg.num_pages, cfg.page_size, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len = (
                pages, PAGE, n, 1 << 20, max_len)
            steps = 10 if args.quick or n >= 256 else 40
            native = step_times(_C.Planner(cfg), native_metadata, n, ctx, steps)
            python = step_times(ReferencePlanner(pages, PAGE, n, 1 << 20, max_len), python_metadata, n, ctx, steps)
            rows.append({"num_seqs": n, "context": ctx, "native_plan_us": round(native, 1),
                         "python_plan_us": round(python, 1), "speedup": round(python / native, 1)})
            print(f"seqs {n:5d} context {ctx:5d}: native {native:9.1f} us   python {python:10.1f} us   "
                  f"({python / native:5.1f}x)")
    engine_rows = bench_engine(rounds=2 if args.quick else 5)
    if args.json:
        write_json({"results": rows, "engine": engine_rows}, args.json)


def bench_engine(rounds: int) -> list:
    from sonarspec_ext import LLM, SamplingParams, SpecConfig
    from sonarspec_ext.bench.spec import PROMPTS
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    rows = []
    for name, spec, batch in (("plain", SpecConfig(), 8), ("draft_target K=4", SpecConfig(
            method="draft_target", num_draft_tokens=4), 8), ("mtp K=3", SpecConfig(method="mtp", num_draft_tokens=3), 1)):
        llms = {flag: LLM("default", spec=spec, async_planning=flag, enable_prefix_caching=False) for flag in (False, True)}
        per_step = {flag: [] for flag in llms}
        for _ in range(rounds):
            for flag, llm in llms.items():
                eng = llm.engine
                steps, t0 = eng.num_steps, time.perf_counter()
                for i in range(0, len(PROMPTS), batch):
                    llm.generate(PROMPTS[i:i + batch], params)
                per_step[flag].append((time.perf_counter() - t0) / (eng.num_steps - steps) * 1e6)
        timing = {flag: llm.stats()["timing"] for flag, llm in llms.items()}
        serial, ahead = statistics.median(per_step[False]), statistics.median(per_step[True])
        steps = {flag: llm.engine.num_steps for flag, llm in llms.items()}
        rows.append({"scheme": name, "batch": batch, "serial_step_us": round(serial, 1),
                     "async_step_us": round(ahead, 1), "async_vs_serial": round(ahead / serial, 3),
                     "serial_plan_us_per_step": round(timing[False]["plan"] / steps[False] * 1e6, 1),
                     "async_wait_us_per_step": round(timing[True]["wait"] / steps[True] * 1e6, 1)})
        r = rows[-1]
        print(f"{name:18s} batch {batch}: step {r['serial_step_us']:8.1f} us serial, {r['async_step_us']:8.1f} us "
              f"planned ahead ({r['async_vs_serial']:.3f}x); waiting for the plan {r['async_wait_us_per_step']:.1f} "
              f"us per step")
    return rows


if __name__ == "__main__":
    main()
