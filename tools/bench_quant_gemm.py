#!/usr/bin/env python
"""The native small-M GEMM per weight format - bfloat16 and every block format (Q8_0,
Q4_0, Q4_1, Q4_K, Q6_K) - on d x d matrices cycled so that their bytes exceed the caches:
time per matrix, the weight bytes it streamed per second, and that beside the read
bandwidth measured in the same run (summing a 1 GiB buffer). Block matrices are random
GGUF blocks (their values do not change the time). Median of the rounds.

    python tools/bench_quant_gemm.py [--d 4096] [--rows 1 2 4 8] [--mib 1024] [--json PATH] [--prefetch near far]
                                     [--pages huge heap]

``--prefetch``: every format under each of the weight prefetch modes of the VDPBF16PS and VNNI
kernels (``_C.set_weight_prefetch``; AMX tiles ignore it), interleaved round by round.
``--pages``: where the matrices live - ``huge`` (the default): one buffer advised for 2 MiB
pages, placed by the engine's weight arena (``models/weight_arena.py``); ``heap``: each matrix
in its own allocation (4 KiB pages where the system's huge-page setting is "madvise").
Several: each measured, interleaved round by round.
"""
from __future__ import annotations

import argparse
import statistics
import time

import gguf
import numpy as np
import torch

from sonarspec_ext import _C
from sonarspec_ext.bench import cpu_info, read_bandwidth_gbs, write_json
from sonarspec_ext.models.weight_arena import pack_weights
from sonarspec_ext.ops.linear import kernel_linear, native_gemm_threads
from sonarspec_ext.ops.quantized import QUANTIZED_FORMATS, QuantizedMatrix


def matrices(fmt: str, d: int, mib: int, rng) -> list:
    """Enough d x d matrices of ``fmt`` for ``mib`` MiB of weights (at least two)."""
    if fmt == "bf16":
        one = d * d * 2
        make = lambda: torch.randn(d, d).bfloat16()  # noqa: E731
    else:
        qtype = gguf.GGMLQuantizationType[fmt.upper()]
        cols, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        one = d * d // cols * nbytes

        def make():
            b = rng.integers(0, 256, size=(d, d // cols * nbytes), dtype=np.uint8)
            return QuantizedMatrix.from_blocks(b, fmt, d)
    return [make() for _ in range(max(2, (mib << 20) // one))], one


def placed(ws: list, pages: str) -> list:
    """``ws`` as they are (``heap``), or copies of them moved into one huge-page buffer by the
    engine's own ``pack_weights`` (``huge``)."""
    if pages == "heap":
        return ws
    holder = torch.nn.Module()
    holder.weights = [QuantizedMatrix(w.data.clone(), w.format, w.shape) if isinstance(w, QuantizedMatrix)
                      else w.clone() for w in ws]
    pack_weights(holder)
    return holder.weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--mib", type=int, default=1024, help="weight bytes cycled per format")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--prefetch", nargs="+", choices=["near", "far", "none"], default=None,
                    help="weight prefetch modes to compare (default: this CPU's)")
    ap.add_argument("--pages", nargs="+", choices=["huge", "heap"], default=["huge"],
                    help="the matrices in one huge-page buffer (as the engine's weights) or each in its own "
                         "allocation (default: huge)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    gbs = read_bandwidth_gbs()
    print(f"d {args.d}, {args.threads} threads, {_C.quant_kernel()} kernel, read bandwidth {gbs:.1f} GB/s")
    rows = []
    for fmt in ("bf16",) + QUANTIZED_FORMATS:
        cols = 1 if fmt == "bf16" else gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt.upper()]][0]
        if args.d % cols:
            print(f"  {fmt:5s} skipped: its blocks take {cols} columns, which do not divide d {args.d}")
            continue
        ws, one = matrices(fmt, args.d, args.mib, rng)
        layouts = {pages: placed(ws, pages) for pages in args.pages}
        settings = [(mode, pages) for mode in (args.prefetch or [_C.weight_prefetch()]) for pages in args.pages]
        for m in args.rows:
            x = torch.randn(m, args.d)
            times = {key: [] for key in settings}
            with native_gemm_threads():
                for mats in layouts.values():   # warm-up
                    for w in mats:
                        kernel_linear(x, w)
                for _ in range(args.rounds):
                    for mode, pages in settings:
                        _C.set_weight_prefetch(mode)
                        mats = layouts[pages]
                        t0 = time.perf_counter()
                        for w in mats:
                            kernel_linear(x, w)
                        times[(mode, pages)].append((time.perf_counter() - t0) / len(mats))
            for mode, pages in settings:
                t = statistics.median(times[(mode, pages)])
                row = {"format": fmt, "rows": m, "bytes": one, "us": round(t * 1e6, 1),
                       "weight_gbs": round(one / t / 1e9, 2), "of_bandwidth": round(one / t / 1e9 / gbs, 3),
                       "prefetch": mode, "pages": pages}
                rows.append(row)
                label = (f" {mode:4s}" if args.prefetch else "") + (f" {pages:4s}" if len(args.pages) > 1 else "")
                print(f"  {fmt:5s} M {m}{label}: {row['us']:8.1f} us per "
                      f"matrix ({one / 2**20:5.1f} MiB), {row['weight_gbs']:5.1f} GB/s of weights = "
                      f"{row['of_bandwidth']:.0%} of the read bandwidth")
        del ws, layouts
    if args.json:
        write_json({"d": args.d, "threads": args.threads, "cpu": cpu_info(), "quant_kernel": _C.quant_kernel(),
                    "read_bandwidth_gbs": round(gbs, 2), "mib": args.mib, "rounds": args.rounds, "pages": args.pages,
                    "torch": torch.__version__, "results": rows}, args.json)


if __name__ == "__main__":
    main()
