#!/usr/bin/env python
"""Markdown tables from the benchmark JSON files (what the README shows).

    python tools/bench_tables.py docs/bench/spec.json
"""
from __future__ import annotations

import json
import sys

from sonarspec_ext.bench.spec import acceptance_note


def spec_table(info: dict) -> str:
    lines = ["| batch | scheme | tok/s | vs plain | tau | acceptance per position |",
             "|-------|--------|-------|----------|-----|-------------------------|"]
    for r in info["results"]:
        if "error" in r:
            lines.append(f"| {r['batch_size']} | {r['scheme']} | failed: {r['error']} | | | |")
            continue
        tau = f"{r['tau']:.2f}" if "tau" in r else ""
        acc = acceptance_note(r)
        lines.append(f"| {r['batch_size']} | {r['scheme']} | {r['tok_s']:.1f} | {r['speedup']:.2f}x | {tau} | {acc} |")
    return "\n".join(lines)


def decode_table(info: dict) -> str:
    lines = ["| batch | sonarspec tok/s | transformers tok/s | ratio |", "|-------|-----|-----|-----|"]
    for r in info["results"]:
        lines.append(f"| {r['batch_size']} | {r['sonarspec_tok_s']:.1f} | {r['transformers_tok_s']:.1f} | "
                     f"{r['sonarspec_tok_s'] / r['transformers_tok_s']:.2f}x |")
    return "\n".join(lines)


def attention_table(rows: list) -> str:
    lines = ["| context | query tokens | chain us | tree us (cascade) | tree us (full mask, SDPA) | tree / chain |",
             "|---------|--------------|----------|-------------------|---------------------------|--------------|"]
    for r in rows:
        lines.append(f"| {r['context']} | {r['query_tokens']} | {r['chain_us']:.1f} | {r['tree_us']:.1f} | "
                     f"{r['tree_full_mask_us']:.1f} | {r['tree_vs_chain']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as fh:
            info = json.load(fh)
        rows = info["results"]
        print(decode_table(info) if rows and "sonarspec_tok_s" in rows[0] else spec_table(info))
        print()
        if "attention" in info:
            print(attention_table(info["attention"]))
            print()
