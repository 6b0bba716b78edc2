"""Paged attention against context length: one step's attention over every layer's KV
pools (each layer its own pools, so keys and values come from memory as in a real step),
for a decode token and a verification block, per KV cache dtype.

    python tools/bench_attention_context.py [--contexts 128 1024 3072] [--tokens 1 5]
                                            [--dtypes bfloat16 float32] [--json PATH]

Defaults are SmolLM2-135M's attention shape (30 layers, 9 query heads, 3 KV heads, head_dim
64, pages of 16 tokens, laid out one after another as a single sequence's are). Prints the
median milliseconds per step and the bytes of keys and values it reads. Each layer's call is
checked once through ``ops.paged_attention``, then the kernel is timed as the decoder stack
calls it, without the Python argument checks (about 50 us a call: as much as the kernel
itself at a few hundred keys).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from sonarspec_ext import ops
from sonarspec_ext.bench import cpu_info, write_json
from sonarspec_ext.ops.linear import native_gemm_threads
from sonarspec_ext.ops.paged_attention import paged_attention_cpu_into


def step_ms(pools, context: int, tokens: int, heads: int, head_dim: int, page_size: int, threads: int,
            repeats: int) -> float:
    """Median ms of one step: ``tokens`` query tokens at the end of a ``context``-token
    sequence (a causal block) against every layer's pools."""
    g = torch.Generator().manual_seed(context + tokens)
    q = torch.randn(tokens, heads, head_dim, generator=g)
    table = torch.arange(pools[0][0].shape[0] // page_size)[None, :]
    seq, begin = torch.zeros(tokens, dtype=torch.long), torch.zeros(tokens, dtype=torch.long)
    end = context + 1 + torch.arange(tokens)
    times = []
    with native_gemm_threads(threads):
        outs = [ops.paged_attention(q, k, v, table, page_size, seq, begin, end, head_dim ** -0.5) for k, v in pools]
        timed = torch.empty_like(outs[0])
        for _ in range(repeats + 2):
            t0 = time.perf_counter()
            for k, v in pools:
                paged_attention_cpu_into(timed, q, k, v, table, page_size, seq, begin, end, head_dim ** -0.5)
            times.append(time.perf_counter() - t0)
    if not torch.equal(timed, outs[-1]):
        raise RuntimeError("the kernel called directly gave other results than ops.paged_attention")
    return 1e3 * statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 1024, 3072])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for name in args.dtypes:
        dtype = getattr(torch, name)
        slots = (max(args.contexts) + max(args.tokens) + args.page_size) // args.page_size * args.page_size
        g = torch.Generator().manual_seed(0)
        shape = (slots, args.kv_heads, args.head_dim)
        pools = [(torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype))
                 for _ in range(args.layers)]
        for context in args.contexts:
            kv_mb = 2 * args.layers * context * args.kv_heads * args.head_dim * dtype.itemsize / 1e6
            for tokens in args.tokens:
                ms = step_ms(pools, context, tokens, args.heads, args.head_dim, args.page_size, args.threads,
                             args.repeats)
                rows.append({"kv_dtype": name, "context": context, "tokens": tokens, "ms": round(ms, 3),
                             "kv_mb": round(kv_mb, 1)})
                print(f"{name:8s} context {context:5d} tokens {tokens:2d}: {ms:7.2f} ms per step "
                      f"({kv_mb:.1f} MB of keys and values)")
    if args.json:
        write_json({"cpu": cpu_info(), "threads": args.threads, "layers": args.layers, "heads": args.heads,
                    "kv_heads": args.kv_heads, "head_dim": args.head_dim, "rows": rows}, args.json)


if __name__ == "__main__":
    main()
