#!/usr/bin/env python
"""ops.chain_speculative_sampling (native CPU kernel) against its torch reference and the
engine's vectorised per-request verifier, ops.tree_speculative_sampling against its
reference, and ops.sampling.processed_probs (the distribution a sampled request draws
from: temperature, top-k, top-p) against its torch reference on rows shaped like
SmolLM2's logits; same inputs, same run; median of 5 batches.

    python tools/bench_sampling.py [--json PATH] [--quick]
"""
from __future__ import annotations

import argparse

import torch

from sonarspec_ext import ops
from sonarspec_ext.bench import median_us, write_json
from sonarspec_ext.ops.sampling import processed_probs, processed_probs_reference
from sonarspec_ext.testing.reference import chain_speculative_sampling_reference, tree_speculative_sampling_reference
from sonarspec_ext.params import SamplingParams
from sonarspec_ext.spec.tree import DraftTree
from sonarspec_ext.spec.verify import verify_chain_device




def case(B: int, K: int, V: int):
    g = torch.Generator().manual_seed(B * K + V)
    logits = torch.randn(B, K + 1, V, generator=g) * 2
    p = logits.softmax(-1)
    q = (torch.randn(B, K, V, generator=g) * 2).softmax(-1)
    ids = torch.randint(0, V, (B, K), generator=g)
    u = torch.rand(B, K + 1, dtype=torch.float64, generator=g)
    return logits, p, q, ids, u


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    shapes = [(64, 4, 32000)] if args.quick else [(1, 4, 32000), (8, 4, 32000), (64, 4, 32000), (64, 1, 32000),
                                                  (64, 7, 32000), (16, 4, 128256)]
    params = SamplingParams(temperature=1.0)
    rows = []
    for B, K, V in shapes:
        logits, p, q, ids, u = case(B, K, V)
        native = median_us(lambda: ops.chain_speculative_sampling(q, ids, p, uniforms=u), 20)
        reference = median_us(lambda: chain_speculative_sampling_reference(q, ids, p, u), 2)
        gen = torch.Generator().manual_seed(0)
        per_request = median_us(lambda: [verify_chain_device(logits[b], ids[b], q[b], params, gen) for b in range(B)], 2)
        row = {"batch": B, "k": K, "vocab": V, "native_us": round(native, 1), "reference_us": round(reference, 1),
               "engine_per_request_us": round(per_request, 1), "native_vs_reference": round(reference / native, 1)}
        rows.append(row)
        print(f"B {B:3d} K {K} V {V:6d}: native {native:9.1f} us   torch reference {reference:10.1f} us "
              f"({reference / native:6.1f}x)   engine per-request verifier {per_request:10.1f} us")
    trees = []
    for B, N, V in [(8, 16, 32000)] if args.quick else [(1, 16, 32000), (8, 16, 32000), (64, 8, 32000)]:
        g = torch.Generator().manual_seed(B + N)
        parents = [-1] + [(i - 1) // 4 for i in range(1, N)]      # top-4 children, breadth first
        first, nxt = (torch.from_numpy(a).repeat(B, 1) for a in DraftTree([0] * N, parents).links())
        p = (torch.randn(B, N, V, generator=g) * 2).softmax(-1)
        cand = torch.randint(0, V, (B, N), generator=g)
        u = torch.rand(B, N + 1, dtype=torch.float64, generator=g)
        native = median_us(lambda: ops.tree_speculative_sampling(cand, first, nxt, p, uniforms=u), 20)
        reference = median_us(lambda: tree_speculative_sampling_reference(cand, first, nxt, p, None, u), 2)
        trees.append({"batch": B, "nodes": N, "vocab": V, "native_us": round(native, 1),
                      "reference_us": round(reference, 1), "native_vs_reference": round(reference / native, 1)})
        print(f"tree B {B:3d} N {N:2d} V {V:6d}: native {native:9.1f} us   torch reference {reference:10.1f} us "
              f"({reference / native:6.1f}x)")
    processed = processed_rows(args.quick)
    if args.json:
        write_json({"threads": torch.get_num_threads(), "torch": torch.__version__, "results": rows,
                    "trees": trees, "processed_probs": processed}, args.json)


def processed_rows(quick: bool):
    """processed_probs against the torch reference: 1 row (a sampled decode) and 5 rows (a
    verification of 1 + 4 tokens) over a 49152-token vocabulary, logits with a language
    model's spread (a few large values over a long flat tail)."""
    out = []
    g = torch.Generator().manual_seed(0)
    settings = [(0.7, 0, 1.0), (0.7, 40, 1.0)] if quick else [(0.7, 0, 1.0), (0.7, 40, 1.0), (0.7, 0, 0.95),
                                                              (1.0, 50, 0.9)]
    for rows in (1, 5):
        logits = torch.randn(rows, 49152, generator=g) * 2.5 + torch.empty(rows, 49152).exponential_(generator=g) * 2
        for t, k, p in settings:
            with torch.inference_mode():
                native = median_us(lambda: processed_probs(logits, t, k, p), 50)
                reference = median_us(lambda: processed_probs_reference(logits, t, k, p), 5)
            out.append({"rows": rows, "vocab": 49152, "temperature": t, "top_k": k, "top_p": p,
                        "native_us": round(native, 1), "reference_us": round(reference, 1)})
            print(f"processed_probs rows {rows} T {t} top_k {k:2d} top_p {p}: native {native:7.1f} us   "
                  f"torch reference {reference:8.1f} us ({reference / native:5.1f}x)")
    return out


if __name__ == "__main__":
    main()
