#!/usr/bin/env python
"""The OpenAI-compatible server under load: requests/s, output tokens/s, time to first token
and inter-token latency (p50 / p99) at several concurrencies, plain vs speculative, over
streaming chat requests (the benchmark's held-out chat questions, cycled). Each
configuration runs its own server in this process on a loopback port; the clients run in
a process of their own (``--client-process``, the default), so they do not share the
server's interpreter (and its lock) - the engine's busy share of the wall time is then the
server's own efficiency.

    python tools/bench_serve.py [--model smollm2] [--specs none mtp llama.cpp llama.cpp+lookup]
                                [--concurrency 1 4 16] [--requests 16] [--max-tokens 96] [--spec-max-batch N]
                                [--lookup-draft-tokens 8] [--system TEXT] [--prefix-caching]
                                [--json PATH]

``llama.cpp`` in ``--specs`` runs the same load against llama-cpp-python's OpenAI-compatible
server (``python -m llama_cpp.server``, a process of its own with as many threads as torch
uses here) on the same GGUF file, ``llama.cpp+lookup`` with its prompt-lookup speculative
decoding; skipped with a note where ``llama_cpp.server`` is not importable (``pip install
'llama-cpp-python[server]'``). That server answers one request at a time, the others
queued.

The engine's prefix cache is off unless ``--prefix-caching``: the questions cycle, and the
cache would answer repeated prompts from memory. ``--system TEXT`` puts the same system
message before every question and makes each question unique (its request's number after
it), so that what the cache can find is the shared system prompt.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Optional

import httpx
import torch

from sonarspec_ext.params import QUANTIZATION_CHOICES
from sonarspec_ext import LLM, SpecConfig
from sonarspec_ext.assets import resolve
from sonarspec_ext.models.gguf import gguf_file
from sonarspec_ext.bench import cpu_info, write_json
from sonarspec_ext.bench.spec import CHAT_QUESTIONS
from sonarspec_ext.cli import DEFAULT_LOOKUP_DRAFT_TOKENS
from sonarspec_ext.server.app import create_app


LLAMA_CPP_SPECS = ("llama.cpp", "llama.cpp+lookup")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(llm: LLM, name: str):
    import uvicorn
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(llm, name), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=srv.run, daemon=True).start()
    while not srv.started:
        time.sleep(0.05)
    return srv, f"http://127.0.0.1:{port}"


def start_llama_cpp_server(model_file: str, lookup: bool, timeout_s: float = 180.0):
    """llama-cpp-python's server on ``model_file`` (with prompt-lookup decoding when
    ``lookup``) in a process of its own: (process, base URL) once it answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model_file, "--host", "127.0.0.1",
           "--port", str(port), "--n_threads", str(torch.get_num_threads()), "--n_ctx", "2048",
           "--interrupt_requests", "False"]   # queue concurrent requests (its default cuts the running one)
    if lookup:
        cmd += ["--draft_model", "prompt-lookup-decoding"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama_cpp.server exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"llama_cpp.server did not answer within {timeout_s:.0f} s")


class StepTimes:
    """Durations of the engine's steps: the server's engine thread calls ``engine.step``,
    here wrapped with a clock. Their median at concurrency 1 is a decode step, so the ITL
    beyond it is the server's overhead (HTTP, SSE, the hand-off between threads)."""

    def __init__(self, engine):
        self.times = []
        step = engine.step

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                self.times.append(time.perf_counter() - t0)
        engine.step = timed


async def one_request(http, url, messages, max_tokens):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    t0 = time.perf_counter()
    stamps, tokens = [], 0
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the server answered {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0].get("delta", {}).get("content"):
                stamps.append(time.perf_counter())
    end = time.perf_counter()
    tokens = tokens or len(stamps)   # a server that reports no usage while streaming: one token a chunk
    ttft = stamps[0] - t0 if stamps else end - t0
    itl = (stamps[-1] - stamps[0]) / max(1, tokens - 1) if len(stamps) > 1 else 0.0
    return ttft, itl, tokens, end - t0


def messages(i: int, system: Optional[str]) -> list:
    """Request ``i``'s chat: a held-out question (cycled); with ``system``, that system
    message first and the request's number after the question."""
    question = CHAT_QUESTIONS[i % len(CHAT_QUESTIONS)]
    if system is None:
        return [{"role": "user", "content": question}]
    return [{"role": "system", "content": system}, {"role": "user", "content": f"{question} (request {i})"}]


async def load(url, concurrency, requests, max_tokens, system=None):
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as http:
        async def run(i):
            async with sem:
                return await one_request(http, url, messages(i, system), max_tokens)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(run(i) for i in range(requests)))
        wall = time.perf_counter() - t0
    ttft = sorted(r[0] for r in results)
    itl = sorted(r[1] for r in results)
    pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))]   # noqa: E731
    tokens = sum(r[2] for r in results)
    return {"concurrency": concurrency, "requests": requests, "requests_per_s": requests / wall,
            "output_tok_s": tokens / wall, "per_stream_tok_s": statistics.median(r[2] / r[3] for r in results),
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99),
            "itl_p50_s": pct(itl, 0.5), "itl_p99_s": pct(itl, 0.99)}


def run_load(url, concurrency, requests, max_tokens, system=None) -> dict:
    """``load`` to completion (a client process's entry point)."""
    return asyncio.run(load(url, concurrency, requests, max_tokens, system))


def load_line(spec: str, concurrency: int, row: dict) -> str:
    """The console line of one load's measurements (``load``'s fields)."""
    return (f"{spec:6s} c={concurrency:3d}: {row['requests_per_s']:.2f} req/s, {row['output_tok_s']:.1f} tok/s, "
            f"per stream {row['per_stream_tok_s']:.1f} tok/s, TTFT p50 {row['ttft_p50_s'] * 1e3:.0f} ms "
            f"p99 {row['ttft_p99_s'] * 1e3:.0f} ms, ITL p50 {row['itl_p50_s'] * 1e3:.1f} ms "
            f"p99 {row['itl_p99_s'] * 1e3:.1f} ms")


def plot(rows, path: str) -> bool:
    """Output tokens/s and ITL p50 vs concurrency, one line per spec; False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for spec in dict.fromkeys(r["spec"] for r in rows):
        mine = [r for r in rows if r["spec"] == spec]
        cs = [r["concurrency"] for r in mine]
        a.plot(cs, [r["output_tok_s"] for r in mine], marker="o", label=spec)
        b.plot(cs, [r["itl_p50_s"] * 1e3 for r in mine], marker="o", label=spec)
    for ax, title in ((a, "output tokens/s"), (b, "inter-token latency p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streaming clients")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def llama_cpp_rows(args, spec: str, measure) -> list:
    """The load at each concurrency against llama-cpp-python's server on ``args.model``'s
    GGUF file; none (with a note) where that server or a GGUF file is missing."""
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("llama_cpp.server") is None:
        print(f"{spec}: skipped - llama_cpp.server is not importable (pip install 'llama-cpp-python[server]')")
        return []
    model_file = gguf_file(resolve(args.model, "target"))
    if model_file is None:
        print(f"{spec}: skipped - {args.model} is not a GGUF file")
        return []
    t0 = time.perf_counter()
    proc, url = start_llama_cpp_server(model_file, lookup=spec.endswith("+lookup"))
    startup = time.perf_counter() - t0
    rows = []
    try:
        measure(url, 1, 2, 8)   # warm-up
        for c in args.concurrency:
            row = {"spec": spec, "startup_s": startup, "model_file": os.path.basename(model_file),
                   "client_process": args.client_process,
                   **measure(url, c, max(args.requests, c), args.max_tokens, args.system)}
            rows.append(row)
            print(f"{load_line(spec, c, row)} (start-up {startup:.1f} s)", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quantization", default="none", choices=QUANTIZATION_CHOICES,
                    help="the model's weights (none: float; auto: a GGUF file's own blocks)")
    ap.add_argument("--spec-control", default="always", choices=["always", "adaptive"],
                    help="adaptive: the engine speculates only while it measures faster (serve's default)")
    ap.add_argument("--specs", nargs="+", default=["none", "mtp"])
    ap.add_argument("--lookup-draft-tokens", type=int, default=DEFAULT_LOOKUP_DRAFT_TOKENS,
                    help="lookup drafts beside mtp / draft_target, as `sonarspec serve` drafts them (0: none)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--spec-max-batch", type=int, default=None, help="the server's load control (serve's flag)")
    ap.add_argument("--system", default=None, help="a system message before every (then unique) question")
    ap.add_argument("--prefix-caching", action="store_true", help="the engine's prefix cache on")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="PNG of throughput and ITL vs concurrency (needs matplotlib)")
    ap.add_argument("--client-process", action=argparse.BooleanOptionalAction, default=True,
                    help="run the clients in their own process (--no-client-process: in this one)")
    args = ap.parse_args()
    clients = None
    if args.client_process:
        import multiprocessing
        clients = multiprocessing.get_context("spawn").Pool(1)
    measure = (lambda *a: clients.apply(run_load, a)) if clients is not None else run_load
    rows = []
    for spec in args.specs:
        if spec in LLAMA_CPP_SPECS:
            rows += llama_cpp_rows(args, spec, measure)
            continue
        t0 = time.perf_counter()
        control = {} if args.spec_max_batch is None else {"spec_max_batch": args.spec_max_batch}
        control["adaptive_speculation"] = args.spec_control == "adaptive"
        lookup = args.lookup_draft_tokens if spec in ("mtp", "draft_target") else 0
        llm = LLM(args.model, spec=SpecConfig(method=spec, lookup_draft_tokens=lookup), quantization=args.quantization,
                  enable_prefix_caching=args.prefix_caching, **control)
        srv, url = start_server(llm, args.model)
        startup = time.perf_counter() - t0
        steps = StepTimes(llm.engine)
        measure(url, 1, 2, 8)   # warm-up
        for c in args.concurrency:
            busy0, steps0 = sum(llm.engine.timing.values()), len(steps.times)
            measured = measure(url, c, max(args.requests, c), args.max_tokens, args.system)
            # the engine's share of the wall time: at concurrency 1 the rest is the server's
            # overhead (HTTP, SSE, the hand-off between threads; the clients' too without
            # --client-process)
            wall = measured["requests"] / measured["requests_per_s"]
            busy = (sum(llm.engine.timing.values()) - busy0) / wall
            step = statistics.median(steps.times[steps0:])
            row = {"spec": spec, "lookup_draft_tokens": lookup, "spec_max_batch": args.spec_max_batch,
                   "prefix_caching": args.prefix_caching, "system": args.system,
                   "spec_control": args.spec_control,
                   "quantization": args.quantization, "startup_s": startup, "engine_busy_fraction": busy,
                   "engine_step_p50_s": step, "itl_over_step": measured["itl_p50_s"] / step - 1,
                   "client_process": args.client_process, **measured}
            if llm.engine.spec_control is not None:   # cumulative over the concurrencies so far
                row["adaptive_speculation"] = llm.engine.spec_control.summary()
            rows.append(row)
            print(f"{load_line(spec, c, row)} (engine step p50 {step * 1e3:.2f} ms: ITL "
                  f"{row['itl_over_step']:+.1%}), engine busy {busy:.0%} of the wall time "
                  f"(start-up {startup:.1f} s)", flush=True)
        srv.should_exit = True
        time.sleep(0.5)
    if clients is not None:
        clients.close()
    if args.json:
        write_json({"model": args.model, "max_tokens": args.max_tokens, "spec_max_batch": args.spec_max_batch,
                    "cpu": cpu_info(), "rows": rows}, args.json)
    if args.plot and not plot(rows, args.plot):
        print("bench_serve: matplotlib is not installed; no chart written")


if __name__ == "__main__":
    main()
