#!/usr/bin/env python
"""Plain decoding of one model: total decoding throughput (prefill excluded) against batch
size, one decode step's time against context length (JSON and a PNG with both curves),
and prefill speed.

    python tools/bench_scaling.py [--model smollm2] [--batch-sizes 1 2 4 8 16] [--prefill 64 256 1024]
                                  [--contexts 128 512 1024 2048 3072] [--context-rounds 5]
                                  [--json PATH] [--plot PATH]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from sonarspec_ext.params import QUANTIZATION_CHOICES
from sonarspec_ext import LLM, SamplingParams
from sonarspec_ext.bench import cpu_info, median_us, write_json


def throughput(llm: LLM, batch: int, max_tokens: int, repeats: int) -> float:
    """Decoding tokens/s of ``batch`` sequences together, prefill excluded: the median time
    of generating ``max_tokens`` minus that of generating one (which is mostly the prefill)."""
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(100, 40000, (batch, 32), generator=g).tolist()

    def run(n):
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        llm.generate(prompts, params)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            llm.generate(prompts, params)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    return batch * (max_tokens - 1) / (run(max_tokens) - run(1))


def prefill_tok_s(llm: LLM, n: int, repeats: int) -> float:
    """Prompt tokens/s of one ``n``-token prompt (one generated token)."""
    prompt = torch.randint(100, 40000, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    params = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate([prompt], params)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        llm.generate([prompt], params)
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times)


def decode_step_us(llm: LLM, context: int) -> float:
    """One-token forward at position ``context`` of a sequence (keys already in the pool)."""
    runner = llm.engine.runner
    table = list(range(context // runner.kv_cache.page_size + 2))
    meta, pos = runner.metadata([(context, 1, table)])
    ids, rows = torch.tensor([min(1000, llm.engine.model.config.vocab_size - 1)]), torch.arange(1)
    return median_us(lambda: runner.forward(ids, pos, meta, rows), 10, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quantization", default="none", choices=QUANTIZATION_CHOICES,
                      help="the model's weights (none: float; auto: a GGUF file's own blocks)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024, 2048, 3072])
    ap.add_argument("--prefill", type=int, nargs="+", default=[64, 256, 1024], help="prompt lengths")
    ap.add_argument("--context-rounds", type=int, default=5,
                    help="rounds over the contexts; speeds against the first context are medians of per-round ratios")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    if args.context_rounds < 1:
        ap.error(f"--context-rounds must be at least 1, got {args.context_rounds}")
    llm = LLM(args.model, kv_cache_memory=1 << 30, max_num_seqs=max(args.batch_sizes), quantization=args.quantization,
              enable_prefix_caching=False)
    batch = [{"batch_size": b, "tok_s": round(throughput(llm, b, args.max_tokens, args.repeats), 1)}
             for b in args.batch_sizes]
    for r in batch:
        r["vs_batch_1"] = round(r["tok_s"] / batch[0]["tok_s"], 2)
        print(f"batch {r['batch_size']:3d}: {r['tok_s']:8.1f} tok/s  ({r['vs_batch_1']:.2f}x the first)")
    # Contexts in alternating rounds, each ratio to the first context's step taken within a
    # round: the machine's drift between rounds cancels in the median of the ratios.
    steps = [[decode_step_us(llm, c) for c in args.contexts] for _ in range(args.context_rounds)]
    context = [{"context": c, "decode_us": round(statistics.median(s[i] for s in steps), 1),
                "vs_first": round(statistics.median(s[0] / s[i] for s in steps), 3)}
               for i, c in enumerate(args.contexts)]
    for r in context:
        r["tok_s"] = round(1e6 / r["decode_us"], 1)
        print(f"context {r['context']:5d}: decode step {r['decode_us']:9.1f} us = {r['tok_s']:6.1f} tok/s "
              f"({r['vs_first']:.2f}x the speed at {context[0]['context']})")
    prefill = [{"prompt_tokens": n, "tok_s": round(prefill_tok_s(llm, n, args.repeats), 1)} for n in args.prefill]
    for r in prefill:
        print(f"prefill {r['prompt_tokens']:5d} tokens: {r['tok_s']:7.1f} tok/s")
    info = {"model": llm.engine.model_config.architecture, "prefill": prefill, "source": args.model, "threads": torch.get_num_threads(), "cpu": cpu_info(),
            "kv_dtype": str(llm.engine.kv_cache.k.dtype).replace("torch.", ""), "batch": batch, "context": context}
    if args.json:
        write_json(info, args.json)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        a.plot([r["batch_size"] for r in batch], [r["tok_s"] for r in batch], "o-")
        a.set_xlabel("batch size"), a.set_ylabel("tokens/s (all sequences)"), a.set_title("plain decoding throughput")
        b.plot([r["context"] for r in context], [r["tok_s"] for r in context], "o-")
        b.set_xlabel("context length"), b.set_ylabel("tokens/s (one sequence)"), b.set_title("decode speed vs context")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)


if __name__ == "__main__":
    main()
