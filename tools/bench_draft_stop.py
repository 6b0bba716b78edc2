#!/usr/bin/env python
"""MTP chain lengths, confidence stopping (``SpecConfig.draft_stop_prob``) and lookup drafts
(``SpecConfig.lookup_draft_tokens``) on held-out chat prompts: the validation split of
``tools/chat_prompts.py`` (prompts the packaged head was not trained on), or with
``--workload edit`` the code-editing prompts of ``tools/edit_prompts.py`` (the model's reply
repeats much of its prompt; ``edit-long``: its longer functions), each prompt run by plain
decoding and by every configuration back to back, so that the machine's drift hits them
alike; every greedy output checked
equal to plain decoding (``--temperature T``: sampled, seeded per prompt, outputs not
compared; ``--no-draft-sampling``: sampled requests draft top tokens; ``--repetition-penalty``
and the others: every request, plain decoding's too, with those penalties). Prints and writes
tokens/s, the ratio to plain decoding's (over all prompts, and the median of the
per-prompt ratios), tokens per step and drafted tokens per step.

    python tools/bench_draft_stop.py [--model smollm2] [--workload chat|edit|edit-long] [--prompts 60]
                                     [--max-tokens 128] [--batch-size 1]
                                     [--configs 2 3 4:0.1] [--heads default DIR ...] [--head-quantization auto q4_1]
                                     [--adaptive]
                                     [--temperature T] [--top-p P] [--top-k K] [--no-draft-sampling]
                                     [--repetition-penalty R]
                                     [--presence-penalty P] [--frequency-penalty F] [--json PATH]

A configuration is K (chains of K tokens), K:P (at most K, stopped below probability P) or
either with ``+L`` (lookup drafts of up to L tokens where the context repeats: ``3+8``),
run with each of ``--heads`` (default: the model's packaged head) loaded in each of
``--head-quantization`` (``SpecConfig.quantization``; default auto); ``--adaptive`` runs them
under the adaptive speculation control (the CLI default: K is then the longest chain it
measures), else speculating every step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chat_prompts import build_prompts  # noqa: E402
from edit_prompts import edit_prompts  # noqa: E402
from sonarspec_ext import LLM, SamplingParams, SpecConfig  # noqa: E402
from sonarspec_ext.bench import cpu_info, rotated, write_json  # noqa: E402
from sonarspec_ext.params import QUANTIZATION_CHOICES  # noqa: E402
from sonarspec_ext.train.data import is_validation  # noqa: E402


def parse_config(text: str):
    """K[:P][+L] -> (K, P, L)."""
    chain, _, lookup = text.partition("+")
    k, _, p = chain.partition(":")
    return int(k), float(p) if p else 0.0, int(lookup) if lookup else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--workload", default="chat", choices=["chat", "edit", "edit-long"],
                    help="held-out chat prompts, or code-editing prompts (tools/edit_prompts.py; edit-long: "
                         "functions of 1200-8000 characters)")
    ap.add_argument("--prompts", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=1,
                    help="prompts per call, decoding together (ratios per batch instead of per prompt)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--configs", nargs="+", default=["2", "3", "4:0.1"])
    ap.add_argument("--heads", nargs="+", default=["default"], help="MTP head dirs ('default': the packaged one)")
    ap.add_argument("--head-quantization", nargs="+", default=["auto"], choices=QUANTIZATION_CHOICES,
                    help="how each head's matrices load (SpecConfig.quantization): each one measured")
    ap.add_argument("--adaptive", action="store_true", help="under the adaptive speculation control")
    ap.add_argument("--temperature", type=float, default=0.0, help="sample at T (unseeded: rejection sampling); 0: greedy")
    ap.add_argument("--seeded", action="store_true",
                    help="with --temperature: prompt i seeded with i (coupled sampling: every config's output "
                         "checked equal to plain decoding's)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus for sampled requests (1.0: off)")
    ap.add_argument("--top-k", type=int, default=0, help="top-k for sampled requests (0: off)")
    ap.add_argument("--draft-sampling", action=argparse.BooleanOptionalAction, default=True,
                    help="sampled requests draw drafts from the head's distribution (engine option draft_sampling)")
    ap.add_argument("--repetition-penalty", type=float, default=1.0)
    ap.add_argument("--presence-penalty", type=float, default=0.0)
    ap.add_argument("--frequency-penalty", type=float, default=0.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    penalties = {"repetition_penalty": args.repetition_penalty, "presence_penalty": args.presence_penalty,
                 "frequency_penalty": args.frequency_penalty}
    items = ([p for p in build_prompts() if is_validation(p["id"])][:args.prompts] if args.workload == "chat"
                else edit_prompts(args.prompts, long=args.workload == "edit-long"))
    configs = {"plain": None}
    for head in args.heads:
        for quant in args.head_quantization:
            for c in args.configs:
                label = " ".join(([head] if len(args.heads) > 1 else []) +
                                 ([quant] if len(args.head_quantization) > 1 else []) + [c])
                configs[label] = (head, quant, *parse_config(c))
    llms = {name: LLM(args.model, spec=None if c is None else SpecConfig(method="mtp", draft=c[0], quantization=c[1],
                                                                          num_draft_tokens=c[2], draft_stop_prob=c[3],
                                                                          lookup_draft_tokens=c[4]),
                      adaptive_speculation=args.adaptive and c is not None, draft_sampling=args.draft_sampling,
                      enable_prefix_caching=False)
            for name, c in configs.items()}
    total = dict.fromkeys(configs, 0.0)
    ratios = {name: [] for name in configs}
    tokens = dict.fromkeys(configs, 0)
    if args.batch_size < 1:
        raise SystemExit("--batch-size must be >= 1")
    for b, first in enumerate(range(0, len(items), args.batch_size)):
        group = items[first:first + args.batch_size]
        conversations = [[{"role": "user", "content": item["prompt"]}] for item in group]
        params = [SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                 top_k=args.top_k, seed=first + j if args.seeded else None, **penalties)
                  for j in range(len(group))]
        times, outs = {}, {}
        for name, llm in rotated(llms.items(), b):
            t0 = time.perf_counter()
            outs[name] = llm.chat(conversations, params)
            times[name] = time.perf_counter() - t0
        count = {name: sum(len(o.token_ids) for o in out) for name, out in outs.items()}
        for name, out in outs.items():
            for item, o, ref in zip(group, out, outs["plain"]):
                if (args.temperature == 0 or args.seeded) and o.token_ids != ref.token_ids:
                    raise SystemExit(f"{name}: output differs from plain decoding on prompt {item['id']}")
            total[name] += times[name]
            tokens[name] += count[name]
        for name in configs:   # tokens/s against plain decoding's on the prompt (the batch)
            ratios[name].append(count[name] / times[name] / (count["plain"] / times["plain"]))
    rows = []
    for name, llm in llms.items():
        st = llm.stats()
        steps = max(1, st.get("num_steps", 1))
        rows.append({"config": name, "tok_s": round(tokens[name] / total[name], 1),
                     "vs_plain": round(tokens[name] / total[name] / (tokens["plain"] / total["plain"]), 3),
                     "median_prompt_vs_plain": round(statistics.median(ratios[name]), 3),
                     "tokens_per_step": round(st.get("acceptance_length", 1.0), 3),
                     "drafted_per_step": round(st.get("num_draft_tokens", 0) / steps, 3),
                     "accepted_per_position": [round(a, 3) for a in st.get("accepted_per_position", [])]})
        if "adaptive_speculation" in st:   # decode steps per draft length the control ran
            rows[-1]["adaptive_steps"] = st["adaptive_speculation"]["class_steps"]
        r = rows[-1]
        print(f"{name:10s} {r['tok_s']:7.1f} tok/s {r['vs_plain']:.3f}x plain (median per prompt "
              f"{r['median_prompt_vs_plain']:.3f}x), {r['tokens_per_step']:.2f} tokens and "
              f"{r['drafted_per_step']:.2f} drafts per step"
              + (f"; steps per draft length {r['adaptive_steps']}" if "adaptive_steps" in r else ""))
    if args.json:
        write_json({"model": args.model, "workload": args.workload, "heads": args.heads,
                    "head_quantization": args.head_quantization, "adaptive": args.adaptive,
                    "prompts": len(items), "batch_size": args.batch_size,
                    "max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
                    "top_k": args.top_k,
                    "draft_sampling": args.draft_sampling, **penalties, "output_tokens": tokens, "cpu": cpu_info(),
                    "rows": rows}, args.json)


if __name__ == "__main__":
    main()
