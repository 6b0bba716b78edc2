#!/usr/bin/env python
"""A realistic model on a GPU: random weights in the shape of Llama-3.1-8B (bfloat16,
16 GB) or SmolLM2-135M, made on the device (``load_format="dummy"``), one process:

- the HBM floor: weight bytes read per decoding step over the bandwidth of a
  device-to-device copy measured in the same run (bytes read + written);
- plain decoding tok/s at batch 1/8/32, eager and with CUDA graphs, against that floor,
  and the engine's wall time per step against the GPU time of the step's graph replayed
  alone (host overhead = wall - GPU);
- a target forward over T tokens against a one-token decode (T = 1 + K, K = 1..8; draft
  trees of 16/32/64 nodes against chains of equal tokens), with the attention kernel and
  with masked SDPA, eager and graphed;
- speculation at controlled acceptance (``testing.replay.ReplayProposer``: the target's
  own greedy continuation, each draft token kept with probability a): speedup over plain
  decoding against tokens per step, for chains and trees.

    python tools/bench_gpu_model.py --shape llama3-8b --json OUT.json
    python tools/bench_gpu_model.py --shape tiny --device cpu --dtype float32   # a dry run
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import torch

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.bench import LLAMA31_8B, SMOLLM2_135M, SYNTHETIC_30M, synthetic_config_dir, write_json
from sonarspec_ext.ops.cuda_events import median_event_ms
from sonarspec_ext.ops.cuda_gemm_choice import chosen
from sonarspec_ext.runtime.cuda_graphs import StepGraphs
from sonarspec_ext.runtime.metadata import TreeBlock
from sonarspec_ext.spec.proposer import NoProposer
from sonarspec_ext.testing.replay import ReplayProposer, expected_tau

SHAPES = {"llama3-8b": LLAMA31_8B, "smollm2": SMOLLM2_135M, "tiny": SYNTHETIC_30M}


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, device, reps: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes per second moved (read + written) by a 4 GB device-to-device copy."""
    src = torch.randn(1 << 29, device="cuda")   # 2 GiB of float32
    dst = torch.empty_like(src)
    ms = median_event_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms / 1e3)


def weight_bytes(model) -> int:
    """Bytes a decoding step reads: every matrix once (an untied embedding only by lookup)."""
    emb = model.model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    tied = model.lm_head.weight.data_ptr() == emb.data_ptr()
    return total - (0 if tied else emb.numel() * emb.element_size())


def prompts(n: int, length: int, vocab: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(300, vocab, length).tolist() for _ in range(n)]


def step_times(llm, fn) -> list:
    """Runs ``fn`` with the engine's step wall times (ms) recorded."""
    eng, times = llm.engine, []
    step = eng.step

    def timed():
        t0 = time.perf_counter()
        out = step()
        times.append((time.perf_counter() - t0) * 1e3)
        return out
    eng.step = timed
    try:
        fn()
    finally:
        eng.step = step
    return times


def decode_rate(llm, batch: int, vocab: int, device, short: int = 16, long: int = 112) -> dict:
    """Decoding tok/s from two runs of different lengths (their difference drops the
    prefill and start-up), and the median wall time of the longer run's decode steps."""
    walls = {}
    for n, seed in ((short, 1), (long, 2)):
        ps = prompts(batch, 64, vocab, seed)
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        llm.generate(ps, params)                     # warm: graphs captured, GEMMs timed
        sync(device)
        t0 = time.perf_counter()
        steps = step_times(llm, lambda: llm.generate(ps, params))
        sync(device)
        walls[n] = time.perf_counter() - t0
    rate = batch * (long - short) / (walls[long] - walls[short])
    return {"batch": batch, "tok_s": round(rate, 1), "step_ms": round(statistics.median(steps[3:]), 3)}


def graph_gpu_ms(graphs, batch: int, queries: int = 1):
    """GPU time of the captured graph (of ``StepGraphs`` graphs) for (batch, queries) with
    the most keys, or None."""
    cands = [(k, g) for k, g in graphs.graphs.items() if k[:2] == (batch, queries) and g.graph is not None]
    if not cands:
        return None
    g = max(cands, key=lambda kg: kg[0][2])[1]
    return round(median_event_ms(g.graph.replay, reps=20), 3)


def forward_costs(llm, device, context: int = 512) -> list:
    """A target forward over T tokens of one sequence vs a one-token decode, and draft
    trees vs chains of equal tokens; per attention path and graphs on/off."""
    runner = llm.engine.runner
    table = list(range(context // llm.engine.kv_cache.page_size + 8))
    rng = np.random.default_rng(0)
    cases = [("chain", T, None) for T in range(1, 10)]
    for n in (16, 32, 64):
        cases.append(("chain", n, None))
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        anc = np.eye(n, dtype=bool)
        for i in range(1, n):
            anc[i] |= anc[parents[i]]
        depth = anc.sum(1) - 1
        bits = (anc.astype(np.uint64) * (np.uint64(1) << np.arange(n, dtype=np.uint64))).sum(1, dtype=np.uint64)
        cases.append(("tree", n, TreeBlock(context, bits.view(np.int64), context + depth)))
    kernel_ok, graphs = runner.cuda_attention, runner.graphs
    rows = []
    for attention in (["kernel", "sdpa"] if kernel_ok else ["sdpa"]):
        runner.cuda_attention = attention == "kernel"
        for graphed in ([False, True] if graphs is not None and attention == "kernel" else [graphs is not None]):
            runner.graphs = StepGraphs(runner) if graphed else None
            base = None
            for kind, T, tree in cases:
                meta, pos = runner.metadata([(context, T, table)], trees=None if tree is None else [tree])
                ids = torch.randint(300, 1000, (T,), device=runner.device)
                last = torch.arange(T, device=runner.device)[-1:]
                ms = median_ms(lambda: runner.forward(ids, pos, meta, last), device)
                base = ms if (kind, T) == ("chain", 1) else base
                rows.append({"attention": attention, "graphs": graphed, "kind": kind, "tokens": T,
                             "ms": round(ms, 3), "vs_decode": round(ms / base, 3)})
                print(f"  {attention:6s} graphs={graphed!s:5s} {kind:5s} T={T:3d}: {ms:8.3f} ms "
                      f"{ms / base:5.2f}x decode", flush=True)
    runner.cuda_attention, runner.graphs = kernel_ok, graphs
    return rows


def replay_speedups(llm, vocab: int, device, batch: int, max_tokens: int, configs, rounds: int = 1) -> list:
    """Plain decoding, then the replay drafter per (K, acceptance, tree width); ``rounds``
    batches of ``batch`` prompts each."""
    ps = prompts(batch * rounds, 64, vocab, seed=7)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    eng = llm.engine

    def run(proposer):
        eng.proposer = proposer
        llm.generate(ps[:batch], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))   # warm shapes
        eng.finished.clear()
        sync(device)
        t0 = time.perf_counter()
        outs = [o for r in range(rounds) for o in llm.generate(ps[r * batch:(r + 1) * batch], params)]
        sync(device)
        return outs, len(ps) * max_tokens / (time.perf_counter() - t0), llm.stats()["acceptance_length"]
    outs, plain, _ = run(NoProposer())
    refs = {tuple(o.prompt_token_ids): o.token_ids for o in outs}
    rows = [{"batch": batch, "scheme": "plain", "tok_s": round(plain, 1), "speedup": 1.0, "tau": 1.0}]
    for k, a, width in configs:
        got, rate, tau = run(ReplayProposer(refs, a, k, vocab, tree_width=width, seed=k))
        same = sum(o.token_ids == refs[tuple(o.prompt_token_ids)] for o in got)
        scheme = f"chain K={k}" if width == 1 else f"tree {1 + k * width} nodes (depth {k} x {width})"
        rows.append({"batch": batch, "scheme": scheme, "acceptance": a, "expected_tau": round(expected_tau(a, k), 3),
                     "tau": round(tau, 3), "tok_s": round(rate, 1), "speedup": round(rate / plain, 3),
                     "outputs_equal_plain": f"{same}/{len(ps)}"})
        print(f"  batch {batch} {scheme:30s} a={a:.2f} tau={tau:5.2f} {rate:8.1f} tok/s {rate / plain:5.2f}x "
              f"equal {same}/{len(ps)}", flush=True)
    eng.proposer = NoProposer()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b", choices=list(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--parts", nargs="+", default=["decode", "forward", "replay"])
    ap.add_argument("--replay-tokens", type=int, default=96)
    ap.add_argument("--replay-batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--graph-max-tokens", type=int, default=None,
                    help="EngineConfig.cuda_graph_max_tokens (default: the engine's): larger verification steps graphed")
    ap.add_argument("--replay-gemm", nargs="+", default=["auto", "cutlass"], choices=["auto", "cutlass", "torch"],
                    help="GEMM modes of the replay runs (SONARSPEC_CUDA_GEMM): cutlass is batch invariant, so "
                         "verification rows equal decoding rows bit for bit and greedy outputs stay exact")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cuda = torch.device(args.device).type == "cuda"
    tmp = tempfile.TemporaryDirectory()
    path = synthetic_config_dir(tmp.name, SHAPES[args.shape])
    t0 = time.perf_counter()
    llm = LLM(path, device=args.device, dtype=args.dtype, load_format="dummy", cuda_graphs=cuda,
              spec=SpecConfig(method="ngram", num_draft_tokens=8), kv_cache_memory=(6 << 30) if cuda else (256 << 20),
              max_num_seqs=64, enable_prefix_caching=False,
              **({} if args.graph_max_tokens is None else {"cuda_graph_max_tokens": args.graph_max_tokens}))
    llm.engine.proposer = NoProposer()
    vocab, runner = llm.engine.model_config.vocab_size, llm.engine.runner
    out = {"shape": args.shape, "config": SHAPES[args.shape], "dtype": args.dtype, "device": args.device,
           "load_s": round(time.perf_counter() - t0, 1), "weight_bytes": weight_bytes(llm.engine.model)}
    if cuda:
        out["gpu"] = torch.cuda.get_device_name()
        out["copy_bytes_per_s"] = copy_bandwidth()
        out["floor_tok_s_batch1"] = round(out["copy_bytes_per_s"] / out["weight_bytes"], 1)
        print(f"{args.shape}: {out['weight_bytes'] / 1e9:.2f} GB of weights; copy {out['copy_bytes_per_s'] / 1e12:.2f} "
              f"TB/s; floor {out['floor_tok_s_batch1']} steps/s", flush=True)
    def save():   # after every part: a run cut short keeps what it measured
        out["gemm_choices"] = {str(k[:3]): v for k, v in chosen().items()}
        if args.json:
            write_json(out, args.json)
    save()
    if "decode" in args.parts:
        out["decode"] = []
        graphs = runner.graphs
        for graphed in ([True, False] if graphs is not None else [False]):
            runner.graphs = graphs if graphed else None
            for b in args.batches:
                row = {"graphs": graphed, **decode_rate(llm, b, vocab, args.device)}
                row["graph_gpu_ms"] = graph_gpu_ms(graphs, b) if cuda and graphs is not None else None
                if "floor_tok_s_batch1" in out:
                    row["vs_floor"] = round(row["tok_s"] / (b * out["floor_tok_s_batch1"]), 3)
                if row["graph_gpu_ms"]:
                    row["host_overhead"] = round(1 - row["graph_gpu_ms"] / row["step_ms"], 3)
                out["decode"].append(row)
                print(f"  decode {row}", flush=True)
        runner.graphs = graphs
        save()
    if "forward" in args.parts:
        out["forward"] = forward_costs(llm, args.device)
        save()
    if "replay" in args.parts:
        chains = [(k, a, 1) for k in (1, 2, 3, 4, 6) for a in (0.6, 0.8, 0.9)] + [(4, 1.0, 1)]
        trees = [(5, 0.9, 3), (6, 0.9, 5), (9, 0.9, 7)]
        out["replay"] = []
        for gemm in args.replay_gemm:
            os.environ["SONARSPEC_CUDA_GEMM"] = gemm
            if runner.graphs is not None:   # graphs captured under another GEMM mode would replay its kernels
                runner.graphs = StepGraphs(runner)
            for b in args.replay_batches:
                configs = chains + trees if b == 1 else [c for c in chains if c[1] >= 0.8]
                rows = replay_speedups(llm, vocab, args.device, b, args.replay_tokens, configs,
                                       rounds=4 if b == 1 else 1)
                out["replay"] += [{"gemm": gemm, **r} for r in rows]
                save()
        os.environ.pop("SONARSPEC_CUDA_GEMM")
    out["cuda_graphs"] = llm.stats().get("cuda_graphs")
    save()
    tmp.cleanup()


if __name__ == "__main__":
    main()
