"""Speculative decoding benchmark on the packaged models (or any target/draft pair).

Code prompts for base models; for a model with a chat template (SmolLM2), chat
questions rendered with it. Replies run to ``max_tokens`` (``ignore_eos``: past the
end of the turn the model writes the next turn) so every scheme decodes the same tokens.

One process, one run, same prompts: plain decoding, draft_target at several K, ngram,
MTP chains at several K, EAGLE trees drafted by the same head, and transformers generate /
assisted generation (``assistant_model`` = the same draft).
Greedy by default, every scheme's output checked equal to plain decoding first; or sampled.
"""
from __future__ import annotations

import statistics
import time
from typing import List, Optional

import torch
from tqdm import tqdm

from ..assets import resolve
from . import cpu_info, median_time, rotated
from ..llm import LLM
from ..params import SamplingParams, SpecConfig
from ..spec.factory import find_draft_model, find_mtp_head

PROMPTS = [
    "def parse_args(argv):\n",
    "class LRUCache:\n    def __init__(self, capacity):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "    def __repr__(self):\n",
    'def read_config(path):\n    """Read a configuration file and return a dict."""\n',
    "try:\n    import json\nexcept ImportError:\n",
    "def _check_arg(name, value):\n    if not isinstance(value, int):\n",
    "    for key, value in sorted(self.items()):\n",
]


CHAT_QUESTIONS = [
    "Explain how a hash map handles collisions.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "What are three tips for writing a good cover letter?",
    "Describe the water cycle in simple terms.",
    "Write a short poem about autumn leaves.",
    "How do I read a CSV file with pandas and print its first rows?",
    "What is the difference between a process and a thread?",
    "Give me a recipe for a simple tomato pasta sauce.",
]


def bench_prompts(llm: LLM) -> list:
    """The code prompts, or - for a model with a chat template - the chat questions as
    rendered prompts (token ids)."""
    if not llm.tokenizer.chat_template:
        return PROMPTS
    params = SamplingParams()
    return [llm.chat_request([{"role": "user", "content": q}], params)[0] for q in CHAT_QUESTIONS]


def run_batches(llm: LLM, prompts: List[str], params: List[SamplingParams], batch_size: int):
    """``llm``'s outputs for ``prompts``, generated ``batch_size`` at a time."""
    out = []
    for i in range(0, len(prompts), batch_size):
        out += llm.generate(prompts[i:i + batch_size], params[i:i + batch_size])
    return out


def scheme_config(name: str) -> SpecConfig:
    """A profiling tool's scheme name: ``plain``, ``method:k`` (k 4 if left out) with the
    packaged drafter, or ``eagle_tree:depth:top_k:nodes``; ``+L`` after a chain adds lookup
    drafts of up to L tokens (``mtp:3+8``), ``@FORMAT`` at the end quantizes the drafter's
    weights at load (``mtp:3@q8_0``)."""
    name, _, quantization = name.partition("@")
    name, _, lookup = name.partition("+")
    method, *rest = name.split(":")
    if method == "plain":
        return SpecConfig()
    extra = {"quantization": quantization} if quantization else {}
    if lookup:
        extra["lookup_draft_tokens"] = int(lookup)
    if method == "eagle_tree" and len(rest) == 3:
        d, k, n = map(int, rest)
        return SpecConfig(method=method, num_draft_tokens=d, tree_top_k=k, tree_num_nodes=n, **extra)
    if len(rest) > 1:
        raise ValueError(f"scheme {name!r}: expected METHOD:K or eagle_tree:DEPTH:TOP_K:NODES")
    return SpecConfig(method=method, num_draft_tokens=int(rest[0]) if rest else 4, **extra)


def _schemes(draft_dir: Optional[str], mtp_dir: Optional[str], ks, mtp_ks, with_ngram: bool, trees=(),
             draft_quantization: str = "auto", lookup_tokens: int = 0):
    out = [("plain", SpecConfig())]
    if draft_dir:
        out += [(f"draft_target K={k}", SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=k,
                                                   quantization=draft_quantization)) for k in ks]
    if with_ngram:
        out.append(("ngram K=4", SpecConfig(method="ngram", num_draft_tokens=4)))
    if mtp_dir:
        out += [(f"mtp K={k}", SpecConfig(method="mtp", draft=mtp_dir, num_draft_tokens=k,
                                          quantization=draft_quantization)) for k in mtp_ks]
        if lookup_tokens and mtp_ks:   # chains of 3 (the packaged heads' measured best), else the longest asked
            k = 3 if 3 in mtp_ks else max(mtp_ks)
            out.append((f"mtp K={k} +lookup {lookup_tokens}",
                        SpecConfig(method="mtp", draft=mtp_dir, num_draft_tokens=k, lookup_draft_tokens=lookup_tokens,
                                   quantization=draft_quantization)))
        out += [(f"eagle_tree d={d} k={k} n={n}", SpecConfig(method="eagle_tree", draft=mtp_dir, num_draft_tokens=d,
                                                             tree_top_k=k, tree_num_nodes=n,
                                                             quantization=draft_quantization)) for d, k, n in trees]
    return out


def bench_spec(target: str = "default", draft: Optional[str] = "default", ks=(2, 4, 6), batch_sizes=(1, 8),
               max_tokens: int = 96, repeats: int = 3, with_transformers: bool = True,
               threads: Optional[int] = None, mtp: Optional[str] = None, mtp_ks=(1, 2, 3, 4),
               with_ngram: bool = True, spec_max_batch: Optional[int] = None, trees=(), device: str = "cpu",
               dtype: str = "float32", temperature: float = 0.0, top_p: float = 1.0,
               draft_sampling: bool = True, cuda_graphs: Optional[bool] = None, quantization: str = "auto",
               draft_quantization: str = "auto", adaptive: bool = False, lookup_tokens: int = 0,
               seeded: bool = False) -> dict:
    """Every scheme on the same prompts in one process. Each scheme's greedy output is
    first checked equal to plain decoding (on the CPU a difference is an error; on CUDA,
    where torch's GEMMs and SDPA may round a verification pass differently from a decoding
    one, the agreement is recorded); timing rounds are interleaved across schemes (round r
    times every scheme once, starting from the r-th) so machine noise hits all of them
    alike; the reported time is each scheme's median over the rounds. ``trees``: (depth,
    top_k, num_nodes) of the EAGLE trees to run with the MTP head. ``temperature`` > 0 samples
    instead, unseeded (rejection sampling): outputs then differ between schemes by design
    (the tests check the sampled distributions), and agreement is not checked; with
    ``seeded`` each prompt's request is seeded (coupled sampling, ``sampling.uniforms``) and
    every scheme's output is checked equal to plain decoding's, as for greedy. ``draft="default"``: the draft model that
    goes with the target (``spec.factory.find_draft_model``), or no draft_target rows (and
    ``mtp="default"`` the MTP head that goes with it, ``find_mtp_head``, or no MTP rows);
    ``draft_quantization``: its weights (``SpecConfig.quantization``). ``adaptive``: every
    scheme under adaptive speculation (``EngineConfig.adaptive_speculation``; its rows
    record the decode steps that speculated and that ran plainly). ``lookup_tokens``: a row of
    MTP chains (K = 3, or the longest of ``mtp_ks`` without 3) with lookup drafts of up to that
    many tokens (``SpecConfig.lookup_draft_tokens``)."""
    if threads:
        torch.set_num_threads(threads)
    target_dir = resolve(target, "target")
    draft_dir = find_draft_model(target_dir) if draft == "default" else resolve(draft, "draft") if draft else None
    mtp_dir = find_mtp_head(target_dir) if mtp == "default" else resolve(mtp, "mtp") if mtp else None
    sampled = temperature > 0
    schemes = _schemes(draft_dir, mtp_dir, ks, mtp_ks, with_ngram, trees, draft_quantization, lookup_tokens)
    llms = {name: LLM(target_dir, spec=spec, spec_max_batch=spec_max_batch, device=device, dtype=dtype,
                      draft_sampling=draft_sampling, cuda_graphs=cuda_graphs, quantization=quantization,
                      adaptive_speculation=adaptive and name != "plain", enable_prefix_caching=False)
            for name, spec in schemes}
    prompts = bench_prompts(llms["plain"])
    params = [SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                             seed=i if seeded else None, ignore_eos=True) for i in range(len(prompts))]
    rows = []
    for bs in batch_sizes:
        # runs of every prompt: the reference, each scheme's check, then the timing rounds
        bar = tqdm(total=1 + len(schemes) * (1 + repeats), desc=f"bench batch {bs}", unit="run", leave=False,
                   dynamic_ncols=True)
        ref = [o.token_ids for o in run_batches(llms["plain"], prompts, params, bs)]
        bar.update()
        agree = {}
        for name, _ in list(schemes):
            try:
                got = [o.token_ids for o in run_batches(llms[name], prompts, params, bs)]
            except Exception as e:   # one scheme failing (say, on a new device) leaves the others measured
                if name == "plain":
                    raise
                rows.append({"batch_size": bs, "scheme": name, "error": f"{type(e).__name__}: {e}"})
                schemes = [x for x in schemes if x[0] != name]
                bar.update(1 + repeats)
                continue
            bar.update()
            agree[name] = sum(a == b for a, b in zip(got, ref))
            if agree[name] != len(ref) and torch.device(device).type == "cpu" and (seeded or not sampled):
                raise RuntimeError(f"{name} output differs from plain decoding; not timing")
            llms[name].engine.finished.clear()
        times = {name: [] for name, _ in schemes}
        for r in range(repeats):
            for name, _ in rotated(schemes, r):
                t0 = time.perf_counter()
                run_batches(llms[name], prompts, params, bs)
                times[name].append(time.perf_counter() - t0)
                bar.set_postfix_str(f"round {r + 1}/{repeats}: {name}")
                bar.update()
        bar.close()
        base = len(prompts) * max_tokens / statistics.median(times["plain"])
        for name, _ in schemes:
            s = llms[name].stats()
            tok_s = len(prompts) * max_tokens / statistics.median(times[name])
            rows.append({"batch_size": bs, "scheme": name, "tok_s": round(tok_s, 1),
                         "speedup": round(tok_s / base, 3), "tau": round(s["acceptance_length"], 3),
                         "round_s": [round(t, 6) for t in times[name]],
                         "accepted_per_position": [round(a, 3) for a in s["accepted_per_position"]],
                         **({} if sampled else {"greedy_agreement": f"{agree[name]}/{len(ref)}"}),
                         **({k: s["adaptive_speculation"][k] for k in ("speculating_steps", "plain_steps")}
                            if "adaptive_speculation" in s else {}),
                         **({"cuda_graphs": s["cuda_graphs"]} if "cuda_graphs" in s else {})})
        if with_transformers and bs == 1 and draft_dir and not sampled and prompts is PROMPTS:
            rows += _bench_transformers(target_dir, draft_dir, ref, max_tokens, repeats, base, device, dtype)
    return {"target": target_dir, "draft": draft_dir, "mtp": mtp_dir, "spec_max_batch": spec_max_batch,
            "adaptive_speculation": adaptive,
            "max_tokens": max_tokens, "device": str(device), "dtype": dtype, "temperature": temperature, "top_p": top_p,
            "seeded": seeded,
            "draft_sampling": draft_sampling, "quantization": quantization,
            "cuda_graphs": cuda_graphs if cuda_graphs is not None else torch.device(device).type == "cuda",
            "num_prompts": len(prompts), "chat": prompts is not PROMPTS, "repeats": repeats,
            "threads": torch.get_num_threads(), "cpu": cpu_info(),
            "torch": torch.__version__, "results": rows}


def _bench_transformers(target_dir, draft_dir, ref, max_tokens, repeats, base, device="cpu",
                        dtype="float32") -> list:
    """transformers generate and assisted generation at batch 1 (assisted supports only 1)."""
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(target_dir)
    tdtype = getattr(torch, dtype)
    tgt = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=tdtype).to(device).eval()
    dft = transformers.AutoModelForCausalLM.from_pretrained(draft_dir, dtype=tdtype).to(device).eval()
    encoded = [torch.tensor([tok(p)["input_ids"]], device=device) for p in PROMPTS]
    rows = []
    for name, extra in (("transformers", {}), ("transformers assisted", {"assistant_model": dft})):
        def run():
            outs = []
            with torch.no_grad():
                for ids in encoded:
                    o = tgt.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                     min_new_tokens=max_tokens, do_sample=False, pad_token_id=0, **extra)
                    outs.append(o[0, ids.shape[1]:].tolist())
            return outs
        agree = sum(a == b for a, b in zip(run(), ref))
        t = median_time(run, repeats)
        tok_s = len(PROMPTS) * max_tokens / t
        rows.append({"batch_size": 1, "scheme": name, "tok_s": round(tok_s, 1), "speedup": round(tok_s / base, 3),
                     "greedy_agreement": f"{agree}/{len(PROMPTS)}"})
    return rows


def acceptance_note(row: dict) -> str:
    """A result row's per-position acceptance, plus its output agreement with plain
    decoding where that is not total (or the agreement alone, for transformers rows)."""
    acc = " ".join(f"{a:.2f}" for a in row.get("accepted_per_position", []))
    agree = row.get("greedy_agreement", "")
    if agree and ("tau" not in row or agree.split("/")[0] != agree.split("/")[1]):
        acc = f"{acc} (output equal on {agree} prompts)" if acc else f"output equal on {agree} prompts"
    return acc


def print_spec_table(info: dict) -> None:
    print(f"target {info['target']}\ndraft  {info['draft']}\nmtp    {info.get('mtp')}")
    mode = f"T = {info['temperature']}, top-p {info['top_p']}" if info.get("temperature") else "greedy"
    mode += ", seeded (coupled sampling)" if info.get("temperature") and info.get("seeded") else ""
    mode += ", drafts drawn from the drafter's distribution" if info.get("draft_sampling") else ""
    mode += ", CUDA graphs" if info.get("cuda_graphs") else ""
    print(f"{info['num_prompts']} prompts x {info['max_tokens']} tokens, {mode}, median of {info['repeats']} "
          f"interleaved rounds, {info['threads']} threads")
    print(f"{'batch':>5}  {'scheme':<26} {'tok/s':>8} {'vs plain':>8} {'tau':>6}  per-position acceptance")
    for r in info["results"]:
        if "error" in r:
            print(f"{r['batch_size']:>5}  {r['scheme']:<26} failed: {r['error']}")
            continue
        tau = f"{r['tau']:.2f}" if r.get("tau") else "-"   # 0: no step verified drafts (paused)
        acc = acceptance_note(r)
        print(f"{r['batch_size']:>5}  {r['scheme']:<26} {r['tok_s']:>8.1f} {r['speedup']:>7.2f}x {tau:>6}  {acc}")


def plot_spec(info: dict, path: str) -> bool:
    """Bar chart of tokens/s per scheme and batch size; False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    batches = sorted({r["batch_size"] for r in info["results"]})
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4), squeeze=False)
    for ax, bs in zip(axes[0], batches):
        rows = [r for r in info["results"] if r["batch_size"] == bs and "tok_s" in r]
        ax.barh([r["scheme"] for r in rows], [r["tok_s"] for r in rows], color="tab:blue")
        ax.set_title(f"batch {bs}: tokens/s (greedy)")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True
