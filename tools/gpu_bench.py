#!/usr/bin/env python
"""Times the CUDA kernels with CUDA events (median of 50) and compares each with a
device-to-device copy of the bytes it must read, measured in the same run.

    python tools/gpu_bench.py --json results.json
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from sonarspec_ext import ops
from sonarspec_ext.bench import write_json
from sonarspec_ext.ops.cuda_events import median_event_ms


def cuda_median_us(fn, reps: int = 50) -> float:
    return median_event_ms(fn, reps, warmup=5) * 1e3


def copy_floor_us(num_bytes: int) -> float:
    """Time to read ``num_bytes`` once (a device-to-device copy moves them twice: halved)."""
    src = torch.empty(num_bytes // 4 + 1, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    return cuda_median_us(lambda: dst.copy_(src)) / 2


def bench_sampling(rows: list) -> None:
    for B, K, V in [(1, 4, 32000), (64, 4, 32000), (64, 4, 128256), (256, 4, 32000)]:
        g = torch.Generator(device="cuda").manual_seed(0)
        p = torch.rand(B, K + 1, V, device="cuda", generator=g)
        p /= p.sum(-1, keepdim=True)
        q = torch.rand(B, K, V, device="cuda", generator=g)
        q /= q.sum(-1, keepdim=True)
        ids = torch.randint(0, V, (B, K), device="cuda", generator=g)
        u = torch.rand(B, K + 1, dtype=torch.float64, device="cuda", generator=g)
        us = cuda_median_us(lambda: ops.chain_speculative_sampling(q, ids, p, uniforms=u))
        # floor: the stopping rows of p and q read once (what the kernel must touch at least)
        floor = copy_floor_us(B * V * 4 * 2)
        rows.append({"kernel": "chain_speculative_sampling", "batch": B, "k": K, "vocab": V, "us": round(us, 2),
                     "read_floor_us": round(floor, 2), "vs_floor": round(us / floor, 2)})


def bench_tree_sampling(rows: list) -> None:
    from sonarspec_ext.spec.tree import DraftTree
    for B, N, V in [(1, 16, 32000), (64, 16, 32000), (256, 8, 128256)]:
        g = torch.Generator(device="cuda").manual_seed(0)
        parents = [-1] + [(i - 1) // 4 for i in range(1, N)]
        first, nxt = (torch.from_numpy(a).repeat(B, 1).cuda() for a in DraftTree([0] * N, parents).links())
        p = torch.rand(B, N, V, device="cuda", generator=g)
        p /= p.sum(-1, keepdim=True)
        cand = torch.randint(0, V, (B, N), device="cuda", generator=g)
        u = torch.rand(B, N + 1, dtype=torch.float64, device="cuda", generator=g)
        us = cuda_median_us(lambda: ops.tree_speculative_sampling(cand, first, nxt, p, uniforms=u))
        rows.append({"kernel": "tree_speculative_sampling", "batch": B, "nodes": N, "vocab": V, "us": round(us, 2),
                     "read_floor_us": round(copy_floor_us(B * V * 4), 2)})


def bench_scatter_and_store(rows: list) -> None:
    n, blocks = 4096, 1024
    ids = torch.randint(0, 32000, (n,), device="cuda")
    starts = torch.arange(blocks, device="cuda") * (n // blocks)
    lens = torch.full((blocks,), n // blocks, device="cuda")
    nxt, acc = torch.randint(0, 32000, (blocks,), device="cuda"), torch.randint(0, n // blocks, (blocks,), device="cuda")
    us = cuda_median_us(lambda: ops.shifted_scatter(ids, starts, lens, nxt, acc))
    rows.append({"kernel": "shifted_scatter", "tokens": n, "us": round(us, 2),
                 "read_floor_us": round(copy_floor_us(n * 8), 2)})
    T, H, D, S = 256, 8, 128, 65536
    k_pool = torch.zeros(S, H, D, dtype=torch.bfloat16, device="cuda")
    v_pool = torch.zeros_like(k_pool)
    k, v = torch.randn(T, H, D, dtype=torch.bfloat16, device="cuda"), torch.randn(T, H, D, dtype=torch.bfloat16, device="cuda")
    slots = torch.randperm(S, device="cuda")[:T]
    us = cuda_median_us(lambda: ops.kv_store(k_pool, v_pool, k, v, slots))
    floor = copy_floor_us(2 * T * H * D * 2)
    rows.append({"kernel": "kv_store", "tokens": T, "us": round(us, 2), "read_floor_us": round(floor, 2),
                 "vs_floor": round(us / floor, 2)})


def bench_padded_mlp(rows: list) -> None:
    """The gated MLP of a Llama-3-8B layer (hidden 4096, intermediate 14336, bfloat16) over
    D and 2 D tokens: with 64-row tiles both cost the same blocks up to D = 32. torch's
    F.linear composition is timed beside it."""
    if not ops.built_with_cutlass():
        rows.append({"kernel": "kernel_mlp", "skipped": "build without the CUTLASS GEMM"})
        return
    H, inter = 4096, 14336
    g = torch.Generator(device="cuda").manual_seed(0)
    gate_up = (torch.randn(2 * inter, H, device="cuda", generator=g) / H ** 0.5).bfloat16()
    down = (torch.randn(H, inter, device="cuda", generator=g) / inter ** 0.5).bfloat16()
    x = torch.randn(128, H, device="cuda", generator=g).bfloat16()
    F = torch.nn.functional

    def torch_mlp(t):
        gu = F.linear(t, gate_up)
        return F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], down)
    os.environ["SONARSPEC_CUDA_GEMM"] = "cutlass"   # the CUTLASS kernel itself, not the measured choice
    for D in (1, 2, 4, 8, 16, 32, 64):
        us = {n: cuda_median_us(lambda n=n: ops.kernel_mlp(x[:n], gate_up, down)) for n in (D, 2 * D)}
        ref = {n: cuda_median_us(lambda n=n: torch_mlp(x[:n])) for n in (D, 2 * D)}
        rows.append({"kernel": "kernel_mlp", "tokens": D, "us": round(us[D], 2), "us_2x_tokens": round(us[2 * D], 2),
                     "ratio_2x": round(us[2 * D] / us[D], 3), "torch_us": round(ref[D], 2),
                     "torch_us_2x_tokens": round(ref[2 * D], 2), "vs_torch": round(us[D] / ref[D], 3),
                     "weight_read_floor_us": round(copy_floor_us(3 * H * inter * 2), 2)})
    os.environ.pop("SONARSPEC_CUDA_GEMM")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available() or not ops.built_with_cuda():
        raise SystemExit("gpu_bench: needs a CUDA device and a CUDA build of sonarspec")
    rows: list = []
    bench_sampling(rows)
    bench_tree_sampling(rows)
    bench_scatter_and_store(rows)
    bench_padded_mlp(rows)
    for r in rows:
        print(json.dumps(r))
    if args.json:
        write_json({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": rows}, args.json)


if __name__ == "__main__":
    main()
