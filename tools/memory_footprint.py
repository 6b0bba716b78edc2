#!/usr/bin/env python
"""Where an engine's memory goes after loading: block-format matrices (packed), float
tensors (by model part), the KV pools (both models', ``LLM.memory``; resident only as
requests use them), and the process's resident set (after returning freed heap to the
system), for the target and its drafter; with ``--chat-turns N`` the resident set after
each turn of a greedy chat (128 tokens a reply), as the KV pools fill.

    python tools/memory_footprint.py [--model smollm2] [--quantization auto] [--spec none|mtp|draft_target]
                                     [--chat-turns 3] [--json PATH]
"""
from __future__ import annotations

import argparse
import json

import torch

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.bench import cpu_info, write_json
from sonarspec_ext.models.weight_arena import module_weights, tensor_span, union_bytes
from sonarspec_ext.ops.host_memory import return_freed_memory
from sonarspec_ext.ops.quantized import QuantizedMatrix
from sonarspec_ext.params import QUANTIZATION_CHOICES

MIB = 1 << 20


def _resident_mib() -> float:
    return_freed_memory()   # freed load buffers back to the system first
    with open("/proc/self/status") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024


def weight_parts(model: torch.nn.Module) -> dict:
    """MiB by kind, memory shared by several tensors (tied and fused weights) counted once:
    packed block-format matrices, and float tensors of the embedding and of the rest."""
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    spans = {"blocks": [], "float_embedding": [], "float_other": []}
    for module, w in module_weights(model):
        kind = "blocks" if isinstance(w, QuantizedMatrix) else "float_embedding" if module is embed else "float_other"
        spans[kind].append(tensor_span(w))
    return {k: round(union_bytes(v) / MIB, 1) for k, v in spans.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quantization", default="auto", choices=QUANTIZATION_CHOICES)
    ap.add_argument("--spec", default="none", choices=["none", "mtp", "draft_target"])
    ap.add_argument("--chat-turns", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    before = _resident_mib()
    spec = None if args.spec == "none" else SpecConfig(method=args.spec, draft="default")
    llm = LLM(model=args.model, quantization=args.quantization, spec=spec)
    engine, memory = llm.engine, llm.memory()
    result = {
        "cpu": cpu_info(), "model": args.model, "quantization": args.quantization, "spec": args.spec,
        "target": weight_parts(engine.model),
        "kv_pool_mib": round(memory["kv_pool_bytes"] / MIB, 1), "kv_pool_tokens": memory["kv_pool_tokens"],
        "resident_before_load_mib": round(before), "resident_after_load_mib": round(_resident_mib()),
    }
    conv = [{"role": "user", "content": "Explain how a hash map works."}]
    result["resident_after_turn_mib"] = []
    for _ in range(args.chat_turns):
        reply = llm.chat(conv, SamplingParams(max_tokens=128, temperature=0))[0].text
        conv += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Tell me more."}]
        result["resident_after_turn_mib"].append(round(_resident_mib()))
    drafter = getattr(getattr(engine.proposer, "runner", None), "model", None)
    if drafter is not None:
        result["drafter"] = weight_parts(drafter)   # storages it shares with the target counted again
    print(json.dumps(result, indent=2))
    if args.json:
        write_json(result, args.json)


if __name__ == "__main__":
    main()
