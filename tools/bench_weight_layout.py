#!/usr/bin/env python
"""Where a model's weights and KV pools live, against one decode step's time: three engines
on the same model in one process, timed round by round in turn -

- separate: each weight in its own allocation, KV pools on 4 KiB pages (the layout before
  ``models.weight_arena``);
- arena: the weights back to back in one buffer, still 4 KiB pages (SONARSPEC_NO_HUGE_PAGES=1);
- huge pages: the arena and the KV pools advised for 2 MiB transparent huge pages (the default).

One forward of one token at each context length (keys already in the pool, as
tools/bench_scaling.py times it); medians of the per-round ratios to "separate".

    python tools/bench_weight_layout.py [--model smollm2] [--quantization auto] [--contexts 128 3072]
                                        [--rounds 10] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import sonarspec_ext.models.loader as loader
from sonarspec_ext import LLM
from sonarspec_ext.bench import cpu_info
from sonarspec_ext.params import QUANTIZATION_CHOICES

from bench_scaling import decode_step_us

LAYOUTS = (("separate", False, False), ("arena", True, False), ("huge pages", True, True))


def build(model: str, quantization: str, arena: bool, huge: bool) -> LLM:
    real = loader.pack_weights
    os.environ["SONARSPEC_NO_HUGE_PAGES"] = "0" if huge else "1"   # read at each advice
    if not arena:
        loader.pack_weights = lambda *a, **k: 0
    try:
        return LLM(model=model, quantization=quantization, enable_prefix_caching=False)
    finally:
        loader.pack_weights = real
        os.environ.pop("SONARSPEC_NO_HUGE_PAGES", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quantization", default="auto", choices=QUANTIZATION_CHOICES)
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 3072])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    engines = {name: build(args.model, args.quantization, arena, huge) for name, arena, huge in LAYOUTS}
    times = {(name, c): [] for name in engines for c in args.contexts}
    for _ in range(args.rounds):
        for name, llm in engines.items():
            for c in args.contexts:
                times[(name, c)].append(decode_step_us(llm, c))
    rows = []
    for c in args.contexts:
        base = times[("separate", c)]
        for name in engines:
            t = times[(name, c)]
            ratio = statistics.median(a / b for a, b in zip(t, base))
            rows.append({"context": c, "layout": name, "step_us": round(statistics.median(t), 1),
                         "vs_separate": round(ratio, 3)})
            print(f"context {c:5d}  {name:10s}  {statistics.median(t):9.1f} us  {ratio:.3f}x separate's time")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"cpu": cpu_info(), "model": args.model, "quantization": args.quantization,
                       "rounds": args.rounds, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
