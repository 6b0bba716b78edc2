#!/usr/bin/env python
"""Cost of a target forward over T tokens of one sequence (a verification pass over
1 + K tokens) relative to a one-token decode forward, packaged target, CPU float32;
interleaved rounds, medians.

    python tools/bench_verify_cost.py [--json PATH] [--context 100]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from sonarspec_ext import LLM
from sonarspec_ext.bench import median_us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    runner = LLM("default").engine.runner
    table = list(range(args.context // 16 + 4))
    sizes = (1, 2, 3, 4, 5, 8, 17)
    calls = {}
    for T in sizes:
        meta, pos = runner.metadata([(args.context, T, table)])
        ids, rows = torch.randint(0, 1000, (T,)), torch.arange(T)
        calls[T] = lambda ids=ids, pos=pos, meta=meta, rows=rows: runner.forward(ids, pos, meta, rows)
    times = {T: [] for T in sizes}
    for _ in range(args.rounds):
        for T in sizes:
            times[T].append(median_us(calls[T], 10, 3))
    base = statistics.median(times[1])
    rows = [{"tokens": T, "forward_us": round(statistics.median(times[T]), 1),
             "vs_decode": round(statistics.median(times[T]) / base, 3)} for T in sizes]
    for r in rows:
        print(f"{r['tokens']:3d} tokens: {r['forward_us']:8.1f} us  {r['vs_decode']:.2f}x a decode forward")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"context": args.context, "threads": torch.get_num_threads(), "results": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
