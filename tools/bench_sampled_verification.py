#!/usr/bin/env python
"""Sampled requests' draws and chain verification in one native call from the logits
(``sampling.sampler.sample_chains``, the CPU default) against the route through a tensor of
processed distributions (``sample_chains_from_probs``, what other devices run): the engine's
tokens/s with each, interleaved round by round in one process, for plain decoding and MTP
chains at temperature T. Every run seeds the requests' generators alike, so both routes
draw the same uniforms and their outputs are checked equal. Medians of the rounds.

    python tools/bench_sampled_verification.py [--model smollm2] [--temperature 0.7] [--mtp-ks 2 3]
                                               [--batch-sizes 1] [--rounds 6] [--max-tokens 96] [--json PATH]
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time
from unittest import mock

import torch

import sonarspec_ext.sampling.sampler as sampler
import sonarspec_ext.spec.verify as verify
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.assets import resolve
from sonarspec_ext.bench import cpu_info, rotated, write_json
from sonarspec_ext.bench.spec import bench_prompts, run_batches
from sonarspec_ext.spec.factory import find_mtp_head

ROUTES = {"native": sampler.sample_chains, "probs tensor": sampler.sample_chains_from_probs}


def run(llm: LLM, prompts, params, batch_size: int, route: str):
    """Token ids of every prompt with ``route``, the requests' generators seeded 0, 1, ..."""
    seeds = itertools.count()
    with mock.patch.object(sampler, "sample_chains", ROUTES[route]), \
            mock.patch.object(verify, "sample_chains", ROUTES[route]), \
            mock.patch("sonarspec_ext.engine.request.new_generator",
                       lambda device: torch.Generator(device=device).manual_seed(next(seeds))):
        return [o.token_ids for o in run_batches(llm, prompts, params, batch_size)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--mtp-ks", type=int, nargs="*", default=[2, 3], help="MTP chain lengths (none: plain only)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not args.temperature > 0:
        raise SystemExit("--temperature must be > 0: greedy requests draw nothing")
    target = resolve(args.model, "target")
    schemes = {"plain": None}
    head = find_mtp_head(target) if args.mtp_ks else None
    for k in args.mtp_ks if head else []:
        schemes[f"mtp K={k}"] = SpecConfig(method="mtp", draft=head, num_draft_tokens=k)
    rows = []
    for name, spec in schemes.items():
        llm = LLM(target, spec=spec, adaptive_speculation=False, enable_prefix_caching=False)
        prompts = bench_prompts(llm)
        params = [SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, ignore_eos=True)
                  for _ in prompts]
        for bs in args.batch_sizes:
            run(llm, prompts[:bs], params[:bs], bs, "native")   # warm-up
            speeds, outs = {r: [] for r in ROUTES}, {}
            for r in range(args.rounds):
                for route in rotated(ROUTES, r):
                    t0 = time.perf_counter()
                    outs[route] = run(llm, prompts, params, bs, route)
                    speeds[route].append(len(prompts) * args.max_tokens / (time.perf_counter() - t0))
            if outs["native"] != outs["probs tensor"]:
                raise SystemExit(f"{name}, batch {bs}: outputs differ between the routes")
            ratios = [a / b for a, b in zip(speeds["native"], speeds["probs tensor"])]
            on, off = statistics.median(speeds["native"]), statistics.median(speeds["probs tensor"])
            rows.append({"scheme": name, "batch_size": bs, "native_tok_s": round(on, 1),
                         "probs_tensor_tok_s": round(off, 1), "ratio": round(statistics.median(ratios), 3),
                         "native_rounds": [round(x, 1) for x in speeds["native"]],
                         "probs_tensor_rounds": [round(x, 1) for x in speeds["probs tensor"]]})
            print(f"{name:10s} batch {bs:2d}: native {on:7.1f} tok/s, probs tensor {off:7.1f} tok/s, "
                  f"{statistics.median(ratios):.3f}x (median of {args.rounds} rounds' ratios)")
    if args.json:
        write_json({"model": args.model, "temperature": args.temperature, "max_tokens": args.max_tokens,
                    "rounds": args.rounds, "prompts": len(prompts), "cpu": cpu_info(), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
