#!/usr/bin/env python
"""MTP heads side by side on one target: each head's chains of K = 1..3 (speculating every
step) beside plain decoding, on the held-out chat questions of ``bench.spec``, batch 1,
greedy, in one process - acceptance per draft position, tau and speed-up per head.

    python tools/compare_mtp_heads.py HEAD_DIR [HEAD_DIR ...] [--model smollm2] [--quantization auto]
                                      [--max-tokens 128] [--repeats 2] [--json PATH]
"""
from __future__ import annotations

import argparse

from sonarspec_ext.bench import write_json
from sonarspec_ext.bench.spec import bench_spec
from sonarspec_ext.params import QUANTIZATION_CHOICES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", nargs="+")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quantization", default="auto", choices=QUANTIZATION_CHOICES)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out = {"model": args.model, "quantization": args.quantization, "max_tokens": args.max_tokens,
           "repeats": args.repeats, "heads": {}}
    for head in args.heads:
        r = bench_spec(args.model, draft=None, ks=(), batch_sizes=(1,), max_tokens=args.max_tokens,
                       repeats=args.repeats, with_transformers=False, mtp=head, mtp_ks=tuple(args.ks),
                       with_ngram=False, quantization=args.quantization)
        rows = [{k: x.get(k) for k in ("scheme", "tok_s", "speedup", "tau", "accepted_per_position")}
                for x in r["results"]]
        out["heads"][head] = rows
        for x in rows:
            acc = " ".join(f"{a:.3f}" for a in x["accepted_per_position"] or [])
            print(f"{head}: {x['scheme']:8s} {x['tok_s']:7.1f} tok/s  {x['speedup']:.3f}x  tau {x['tau']:.3f}  {acc}")
    if args.json:
        write_json(out, args.json)


if __name__ == "__main__":
    main()
