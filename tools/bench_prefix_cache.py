#!/usr/bin/env python
"""Prefix caching on and off, two engines on the same model, replies asserted equal (greedy):

- multi-turn chat: each turn's prompt is the whole conversation so far (the chat template
  over the system prompt and every earlier message), so without the cache every turn
  prefills all of it again. The engines answer the same conversations turn by turn,
  alternating which goes first. Per turn: prompt tokens, tokens found in the cache, time to
  first token and the turn's wall time on each; medians over the conversations per turn
  index, and the ratios.
- a batch sharing a system prompt (``--batch N``): N chat requests - the held-out questions,
  cycled, each behind the same long system prompt - queued together on a fresh engine of
  each kind: wall time, median time to first token, prompt tokens found in the cache.

    python tools/bench_prefix_cache.py [--model smollm2] [--turns 4] [--max-tokens 128]
                                       [--batch 16] [--spec none] [--quantization auto] [--json PATH]
"""
from __future__ import annotations

import argparse
import statistics
import time

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.bench import cpu_info, write_json
from sonarspec_ext.bench.spec import CHAT_QUESTIONS
from sonarspec_ext.params import QUANTIZATION_CHOICES

SYSTEM = ("You are a helpful assistant. Answer clearly and concisely, use short paragraphs or lists where "
          "they help, and include a small example when one makes the answer easier to follow.")


def conversations(turns: int):
    """The held-out chat questions as conversations of ``turns`` user messages each."""
    qs = CHAT_QUESTIONS
    return [qs[i:i + turns] for i in range(0, len(qs) - turns + 1, turns)]


def turn(llm: LLM, messages, params):
    t0 = time.perf_counter()
    out = llm.chat(messages, params)[0]
    wall = time.perf_counter() - t0
    return out, {"prompt_tokens": len(out.prompt_token_ids), "cached_tokens": out.stats["num_cached_tokens"],
                 "ttft_s": out.stats["ttft_s"], "wall_s": wall, "output_tokens": len(out.token_ids)}


def engine_options(args) -> dict:
    spec = None if args.spec == "none" else SpecConfig(method=args.spec, num_draft_tokens=args.k)
    return dict(quantization=args.quantization, **({} if spec is None else {"spec": spec}))


def shared_system_batch(args) -> dict:
    """``args.batch`` requests behind one system prompt, queued together, on fresh engines."""
    system = " ".join([SYSTEM] * 3)
    convs = [[{"role": "system", "content": system}, {"role": "user", "content": CHAT_QUESTIONS[i % len(CHAT_QUESTIONS)]}]
             for i in range(args.batch)]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    result, replies = {}, {}
    for name, caching in (("cached", True), ("uncached", False)):
        llm = LLM(args.model, enable_prefix_caching=caching, **engine_options(args))
        llm.generate(["Hello"], SamplingParams(max_tokens=4))   # warm-up, shares nothing with the batch
        t0 = time.perf_counter()
        outs = llm.chat(convs, params)
        wall = time.perf_counter() - t0
        replies[name] = [o.token_ids for o in outs]
        result[name] = {"wall_s": wall, "ttft_ms": statistics.median(o.stats["ttft_s"] for o in outs) * 1e3,
                        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs),
                        "cached_tokens": sum(o.stats["num_cached_tokens"] for o in outs),
                        "output_tokens": sum(len(o.token_ids) for o in outs)}
    assert replies["cached"] == replies["uncached"], "replies differ"
    result["wall_ratio"] = result["uncached"]["wall_s"] / result["cached"]["wall_s"]
    result["ttft_ratio"] = result["uncached"]["ttft_ms"] / result["cached"]["ttft_ms"]
    return result


def run(args) -> dict:
    kw = engine_options(args)
    engines = {"cached": LLM(args.model, enable_prefix_caching=True, **kw),
               "uncached": LLM(args.model, enable_prefix_caching=False, **kw)}
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    records = []
    for c, questions in enumerate(conversations(args.turns)):
        history = {name: [{"role": "system", "content": SYSTEM}] for name in engines}
        for t, q in enumerate(questions):
            order = list(engines) if (c + t) % 2 == 0 else list(engines)[::-1]
            rec, replies = {"conversation": c, "turn": t}, {}
            for name in order:
                history[name].append({"role": "user", "content": q})
                out, rec[name] = turn(engines[name], history[name], params)
                history[name].append({"role": "assistant", "content": out.text})
                replies[name] = out.token_ids
            assert replies["cached"] == replies["uncached"], f"conversation {c} turn {t}: replies differ"
            records.append(rec)
            print(f"conversation {c} turn {t}: {rec['cached']['prompt_tokens']} prompt tokens "
                  f"({rec['cached']['cached_tokens']} cached), TTFT {rec['cached']['ttft_s'] * 1e3:.1f} ms "
                  f"vs {rec['uncached']['ttft_s'] * 1e3:.1f} ms without the cache", flush=True)
    summary = []
    for t in range(args.turns):
        rows = [r for r in records if r["turn"] == t]
        med = lambda name, key: statistics.median(r[name][key] for r in rows)  # noqa: E731
        summary.append({"turn": t, "prompt_tokens": med("cached", "prompt_tokens"),
                        "cached_tokens": med("cached", "cached_tokens"),
                        "ttft_ms": {n: med(n, "ttft_s") * 1e3 for n in engines},
                        "wall_s": {n: med(n, "wall_s") for n in engines},
                        "ttft_ratio": med("uncached", "ttft_s") / med("cached", "ttft_s"),
                        "wall_ratio": med("uncached", "wall_s") / med("cached", "wall_s")})
    return {"command": vars(args), "cpu": cpu_info(), "records": records, "per_turn": summary,
            **({"shared_system_batch": shared_system_batch(args)} if args.batch else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=0, help="also a batch of this many requests sharing a system prompt")
    ap.add_argument("--spec", default="none", choices=["none", "mtp", "draft_target", "ngram"])
    ap.add_argument("--k", type=int, default=2, help="draft tokens per step (with --spec)")
    ap.add_argument("--quantization", default="auto", choices=QUANTIZATION_CHOICES)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not 1 <= args.turns <= len(CHAT_QUESTIONS):
        ap.error(f"--turns must be in [1, {len(CHAT_QUESTIONS)}]")
    result = run(args)
    print("turn  prompt  cached  TTFT cached / uncached (ms)  ratio  turn wall ratio")
    for s in result["per_turn"]:
        print(f"{s['turn']:>4}  {s['prompt_tokens']:>6.0f}  {s['cached_tokens']:>6.0f}  "
              f"{s['ttft_ms']['cached']:>9.1f} / {s['ttft_ms']['uncached']:<9.1f}        "
              f"{s['ttft_ratio']:>5.2f}x {s['wall_ratio']:>6.2f}x")
    b = result.get("shared_system_batch")
    if b:
        c, u = b["cached"], b["uncached"]
        print(f"batch of {args.batch} behind one system prompt: {c['wall_s']:.2f} s vs {u['wall_s']:.2f} s "
              f"({b['wall_ratio']:.2f}x), median TTFT {c['ttft_ms']:.0f} vs {u['ttft_ms']:.0f} ms; "
              f"{c['cached_tokens']} of {c['prompt_tokens']} prompt tokens from the cache")
    if args.json:
        write_json(result, args.json)


if __name__ == "__main__":
    main()
