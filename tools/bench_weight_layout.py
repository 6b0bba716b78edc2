#!/usr/bin/env python
"""Where a model's weights and KV pools live, against one decode step's time: three engines
on the same model in one process, timed round by round in turn -

- separate: each weight in its own allocation, KV pools on 4 KiB pages (the layout before
  ``models.weight_arena``);
- arena: the weights back to back in one buffer, still 4 KiB pages (SONARSPEC_NO_HUGE_PAGES=1);
- huge pages: the arena and the KV pools advised for 2 MiB transparent huge pages (the default).

One forward of one token at each context length (keys already in the pool, as
tools/bench_scaling.py times it), and with ``--chat-rounds N`` whole greedy replies to
held-out chat questions (tok/s, replies asserted equal across the layouts); medians of the
per-round ratios to "separate".

    python tools/bench_weight_layout.py [--model smollm2] [--quantization auto] [--contexts 128 3072]
                                        [--rounds 10] [--chat-rounds 4] [--json PATH]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import sonarspec_ext.models.loader as loader
from sonarspec_ext import LLM, SamplingParams
from sonarspec_ext.bench import cpu_info, write_json
from sonarspec_ext.bench.spec import CHAT_QUESTIONS
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


def chat_tok_s(engines: dict, rounds: int, questions: int = 6, max_tokens: int = 128) -> list:
    """Rows of greedy chat throughput per layout; the replies must not depend on the layout."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    convs = [[{"role": "user", "content": q}] for q in CHAT_QUESTIONS[:questions]]
    speeds, replies = {name: [] for name in engines}, {}
    for _ in range(rounds):
        for name, llm in engines.items():
            t0, tokens = time.perf_counter(), 0
            for conv in convs:
                out = llm.chat(conv, params)[0].token_ids
                tokens += len(out)
                replies.setdefault(name, []).append(out)
            speeds[name].append(tokens / (time.perf_counter() - t0))
    if any(r != replies["separate"] for r in replies.values()):
        raise RuntimeError("the replies depend on the weight layout")
    base = speeds["separate"]
    rows = []
    for name, v in speeds.items():
        ratio = statistics.median(a / b for a, b in zip(v, base))
        rows.append({"layout": name, "chat_tok_s": round(statistics.median(v), 1), "vs_separate": round(ratio, 3)})
        print(f"chat replies  {name:10s}  {statistics.median(v):7.1f} tok/s  {ratio:.3f}x separate's speed")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quantization", default="auto", choices=QUANTIZATION_CHOICES)
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 3072])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--chat-rounds", type=int, default=0, help="rounds of whole chat replies (0: none)")
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
    chat = chat_tok_s(engines, args.chat_rounds) if args.chat_rounds else []
    if args.json:
        write_json({"cpu": cpu_info(), "model": args.model, "quantization": args.quantization,
                    "rounds": args.rounds, "rows": rows, "chat_rounds": args.chat_rounds, "chat": chat}, args.json)


if __name__ == "__main__":
    main()
