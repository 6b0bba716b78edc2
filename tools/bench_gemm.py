#!/usr/bin/env python
"""ops.kernel_linear (native small-M GEMM, float32 and bfloat16 weights) against torch's
F.linear in the same run: d x d weights, M rows, median of 5 timed batches.

    python tools/bench_gemm.py [--json PATH] [--threads 2]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from sonarspec_ext.bench import median_us, write_json
from sonarspec_ext.ops.linear import native_gemm_threads, kernel_linear




def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for d in (1024, 2048):
        w = torch.randn(d, d)
        wb = w.bfloat16()
        for m in (1, 2, 4, 8):
            x = torch.randn(m, d)
            torch_us = median_us(lambda: F.linear(x, w), 200, 20)
            with native_gemm_threads():
                f32_us = median_us(lambda: kernel_linear(x, w), 200, 20)
                bf16_us = median_us(lambda: kernel_linear(x, wb), 200, 20)
            rows.append({"d": d, "m": m, "torch_f32_us": round(torch_us, 1), "native_f32_us": round(f32_us, 1),
                         "native_bf16w_us": round(bf16_us, 1)})
            print(f"d {d:5d} M {m}: F.linear {torch_us:8.1f} us | native float32 {f32_us:8.1f} us "
                  f"({torch_us / f32_us:.2f}x) | native bfloat16 weights {bf16_us:8.1f} us ({torch_us / bf16_us:.2f}x)")
    if args.json:
        write_json({"threads": args.threads, "torch": torch.__version__, "results": rows}, args.json)


if __name__ == "__main__":
    main()
