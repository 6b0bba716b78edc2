#!/usr/bin/env python
"""Decode steps as one native call (``ModelRunner.decode_rows``, the default) against the
per-op path around the same native stack (``runner.policy.decode_rows = False``): the
engine's tokens/s with each, interleaved round by round in one process (this machine's
speed drifts between runs more than the difference), for plain decoding and MTP chains,
at each batch size; outputs checked equal. Medians of the rounds.

    python tools/bench_decode_rows.py [--model smollm2] [--batch-sizes 1 8] [--rounds 8] [--max-tokens 128]
                                      [--mtp-k 3] [--json PATH]
"""
from __future__ import annotations

import argparse
import statistics
import time

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.assets import resolve
from sonarspec_ext.bench import cpu_info, rotated, write_json
from sonarspec_ext.bench.spec import bench_prompts, run_batches
from sonarspec_ext.spec.factory import find_mtp_head


def run(llm: LLM, prompts, params, batch_size: int):
    return [o.token_ids for o in run_batches(llm, prompts, params, batch_size)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--mtp-k", type=int, default=3, help="MTP chain length (0: plain decoding only)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    schemes = {"plain": None}
    target = resolve(args.model, "target")
    head = find_mtp_head(target) if args.mtp_k else None
    if head:
        schemes[f"mtp K={args.mtp_k}"] = SpecConfig(method="mtp", draft=head, num_draft_tokens=args.mtp_k)
    rows = []
    for name, spec in schemes.items():
        llm = LLM(target, spec=spec, adaptive_speculation=False, enable_prefix_caching=False)
        prompts = bench_prompts(llm)
        params = [SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True) for _ in prompts]
        for bs in args.batch_sizes:
            run(llm, prompts[:bs], params[:bs], bs)   # warm-up
            speeds, outs = {True: [], False: []}, {}
            for r in range(args.rounds):
                for native in rotated([True, False], r):
                    llm.engine.runner.policy.decode_rows = native
                    t0 = time.perf_counter()
                    outs[native] = run(llm, prompts, params, bs)
                    speeds[native].append(len(prompts) * args.max_tokens / (time.perf_counter() - t0))
            if outs[True] != outs[False]:
                raise SystemExit(f"{name}, batch {bs}: outputs differ between the paths")
            on, off = statistics.median(speeds[True]), statistics.median(speeds[False])
            faster = sum(a > b for a, b in zip(speeds[True], speeds[False]))
            rows.append({"scheme": name, "batch_size": bs, "native_tok_s": round(on, 1), "per_op_tok_s": round(off, 1),
                         "ratio": round(on / off, 3), "rounds_faster": f"{faster}/{args.rounds}",
                         "native_rounds": [round(x, 1) for x in speeds[True]],
                         "per_op_rounds": [round(x, 1) for x in speeds[False]]})
            print(f"{name:10s} batch {bs:2d}: native decode rows {on:7.1f} tok/s, per-op {off:7.1f} tok/s, "
                  f"{on / off:.3f}x ({faster}/{args.rounds} rounds faster)")
    if args.json:
        write_json({"model": args.model, "max_tokens": args.max_tokens, "rounds": args.rounds,
                    "prompts": len(prompts), "cpu": cpu_info(), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
