#!/usr/bin/env python
"""Where a step's time goes, on the packaged models or ``--model`` (batch 1, greedy or with
``--temperature`` sampled, unseeded: rejection sampling; one prompt at a time): per scheme, the
engine's time split per step and the wall time per step inside the native calls - the
target's decode steps (``decode_rows``: embedding, stack and lm_head in one call), the
target's decoder stack and lm_head in the other steps (prefill), the drafter's
refills (``rows_forward``), chains (``chain``) and refills run with their next chain
(``refill_chain``) - and outside them (Python: planning
hand-off, metadata, packing, verification, bookkeeping). Schemes run in interleaved
rounds; medians per step.

    python tools/profile_spec.py [--schemes plain mtp:3 draft_target:2] [--rounds 3] [--temperature T] [--json PATH]
                                 [--stack-phases]

``--stack-phases`` also splits the native decoder stacks' time by phase (norms, the qkv
projection, RoPE, the KV store, attention, the o projection, the MLP; the native stack's
phase profile, ``_C.set_stack_profile``): per scheme and per stack (the target's, a drafter's,
by layer count) and forward size (rows), microseconds per forward.

Schemes: ``plain``, ``METHOD:K``, ``eagle_tree:DEPTH:TOP_K:NODES``; ``+L`` after a chain adds
lookup drafts of up to L tokens (``mtp:3+8``); ``@FORMAT`` at the end quantizes the drafter at
load (``mtp:3@q8_0``).
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

import sonarspec_ext.runtime.runner as runner_mod
import sonarspec_ext.ops.decoder_stack as decoder_stack
import sonarspec_ext.spec.chains as chains_mod
from sonarspec_ext import LLM, SamplingParams, _C
from sonarspec_ext.bench import cpu_info, rotated, write_json
from sonarspec_ext.bench.spec import PROMPTS, scheme_config
from sonarspec_ext.models.llama import LlamaForCausalLM

_spent = collections.defaultdict(float)


def _timed(owner, name: str, key) -> None:
    """Replaces ``owner.name`` by a wrapper adding its wall time to ``_spent[key]`` (``key``:
    a name, or a function of the call's keyword arguments giving one)."""
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _spent[key if isinstance(key, str) else key(kwargs)] += time.perf_counter() - t0
    setattr(owner, name, wrapper)


def _instrument() -> None:
    _timed(decoder_stack.DecoderStack, "forward", "target stack")
    _timed(LlamaForCausalLM, "compute_logits", "target lm_head")   # drafters' lm_heads run inside their calls
    _timed(runner_mod, "decode_rows_forward", "target decode rows")   # ModelRunner.decode_rows
    _timed(runner_mod, "rows_forward", "drafter refills")
    _timed(chains_mod, "chain", "drafter chains")
    _timed(runner_mod, "refill_chain", "drafter refill+chain")   # a refill with its next chain


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default", help="target: 'default' (packaged), 'smollm2', a dir or .gguf")
    ap.add_argument("--schemes", nargs="+", default=["plain", "mtp:3", "draft_target:2"])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample at T, unseeded (rejection sampling; 0: greedy)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--stack-phases", action="store_true", help="split the native stacks' time by phase")
    args = ap.parse_args()
    _instrument()
    params = [SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, ignore_eos=True)
              for _ in range(len(PROMPTS))]
    llms = {}
    for scheme in args.schemes:
        llms[scheme] = LLM(args.model, spec=scheme_config(scheme), enable_prefix_caching=False)
        llms[scheme].generate(PROMPTS[:2], params[:2])   # warm-up
    rows = collections.defaultdict(list)
    phases = collections.defaultdict(list)   # scheme -> the stack profile's rows, every round
    for r in range(args.rounds):
        for scheme, llm in rotated(llms.items(), r):
            eng = llm.engine
            eng.timing = dict.fromkeys(eng.timing, 0.0)
            steps0 = eng.num_steps
            _spent.clear()
            _C.set_stack_profile(args.stack_phases)
            t0 = time.perf_counter()
            for p, sp in zip(PROMPTS, params):
                llm.generate([p], sp)
            wall = time.perf_counter() - t0
            phases[scheme].extend(_C.take_stack_profile())
            n = eng.num_steps - steps0
            native = {k: v / n * 1e6 for k, v in _spent.items()}
            rows[scheme].append({"steps": n, "tok_s": len(PROMPTS) * args.max_tokens / wall, "step_us": wall / n * 1e6,
                                 "tokens_per_step": len(PROMPTS) * args.max_tokens / n,
                                 "native_us": native, "outside_native_us": wall / n * 1e6 - sum(native.values()),
                                 "engine_split_us": {k: v / n * 1e6 for k, v in eng.timing.items()}})
    out = {}
    for scheme, runs in rows.items():
        med = lambda f: statistics.median(f(r) for r in runs)   # noqa: E731
        keys = sorted({k for r in runs for k in r["native_us"]})
        out[scheme] = {"steps": sum(r["steps"] for r in runs),   # every round's: the phase tables sum them too
                       "tok_s": med(lambda r: r["tok_s"]), "step_us": med(lambda r: r["step_us"]),
                       "tokens_per_step": med(lambda r: r["tokens_per_step"]),
                       "native_us": {k: med(lambda r, k=k: r["native_us"].get(k, 0.0)) for k in keys},
                       "outside_native_us": med(lambda r: r["outside_native_us"]),
                       "engine_split_us": {k: med(lambda r, k=k: r["engine_split_us"][k])
                                           for k in runs[0]["engine_split_us"]}}
        o = out[scheme]
        native = "  ".join(f"{k} {v:.0f}" for k, v in o["native_us"].items())
        print(f"{scheme:16s} {o['tok_s']:7.1f} tok/s  {o['tokens_per_step']:.2f} tokens/step  "
              f"{o['step_us']:.0f} us/step: {native}  outside native calls {o['outside_native_us']:.0f}")
        if args.stack_phases:
            o["stack_phases"] = _phase_table(phases[scheme])
            for p in _most_run(o["stack_phases"]):
                split = "  ".join(f"{k} {v:.0f}" for k, v in p["us_per_forward"].items())
                print(f"    {p['layers']:2d} layers x {p['rows']:2d} rows, {p['forwards']:5d} forwards, "
                      f"us each: {split}")
    if args.json:
        write_json({"threads": torch.get_num_threads(), "cpu": cpu_info(), "max_tokens": args.max_tokens,
                    "rounds": args.rounds, "temperature": args.temperature, "prompts": len(PROMPTS), "schemes": out},
                   args.json)


def _phase_table(profile_rows):
    """The stack profile's rows of every round summed per (layers, rows): forwards and mean
    microseconds per forward in each phase, largest stacks first."""
    sums = {}
    for r in profile_rows:
        key = (r["layers"], r["rows"])
        n, sec = sums.get(key, (0, collections.Counter()))
        sec.update(r["seconds"])
        sums[key] = (n + r["forwards"], sec)
    return [{"layers": layers, "rows": m, "forwards": n,
             "us_per_forward": {k: v / n * 1e6 for k, v in sec.items()}}
            for (layers, m), (n, sec) in sorted(sums.items(), key=lambda kv: (-kv[0][0], kv[0][1]))]


def _most_run(table, per_stack: int = 3):
    """The ``per_stack`` forward sizes of each stack that ran most often (the console's
    excerpt of ``_phase_table``; the JSON keeps every size)."""
    out = []
    for layers in sorted({p["layers"] for p in table}, reverse=True):
        sizes = sorted((p for p in table if p["layers"] == layers), key=lambda p: -p["forwards"])[:per_stack]
        out += sorted(sizes, key=lambda p: p["rows"])
    return out


if __name__ == "__main__":
    main()
