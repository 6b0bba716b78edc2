#!/usr/bin/env python
"""Self-distillation chat corpus: the target model's own replies to the prompts of
``tools/chat_prompts.py``, generated with sonarspec (batched), greedy and sampled.

    python tools/make_chat_corpus.py --out runs/chat_corpus [--model smollm2] [--max-tokens 256]
                                     [--batch-size 16] [--limit N] [--modes greedy sampled]

Writes ``OUT/corpus.jsonl`` (one reply per line: prompt id, split, source, mode, messages,
reply, ``text`` = the rendered conversation with its reply, token counts, finish reason)
and ``OUT/summary.json``. Resumable: replies already in the file are skipped, so a run
that was stopped goes on where it was. The held-out split is chosen by prompt (both modes
of a prompt land in the same split), with ``train.data.is_validation`` on the prompt id;
``sonarspec train-mtp --data OUT/corpus.jsonl`` honours the ``split`` field.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chat_prompts import build_prompts  # noqa: E402
from sonarspec_ext import LLM, SamplingParams  # noqa: E402
from sonarspec_ext.train.data import is_validation  # noqa: E402

SAMPLED_TEMPERATURE = 0.7


def done_keys(path: str) -> set:
    """(prompt id, mode) of every complete line; a torn last line is cut off."""
    keys = set()
    if not os.path.exists(path):
        return keys
    good = 0
    with open(path, "rb") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break
            keys.add((rec["id"], rec["mode"]))
            good += len(line)
    with open(path, "r+b") as fh:
        fh.truncate(good)
    return keys


def params_for(item: dict, mode: str, max_tokens: int) -> SamplingParams:
    if mode == "greedy":
        return SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return SamplingParams(max_tokens=max_tokens, temperature=SAMPLED_TEMPERATURE, seed=int(item["id"][:8], 16))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts (0: all)")
    ap.add_argument("--modes", nargs="+", default=["greedy", "sampled"], choices=["greedy", "sampled"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from tqdm import tqdm
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "corpus.jsonl")
    prompts = build_prompts(args.seed, args.limit)
    done = done_keys(path)
    todo = [(p, m) for p in prompts for m in args.modes if (p["id"], m) not in done]
    llm = LLM(args.model, max_num_seqs=args.batch_size, kv_cache_memory=512 << 20)
    tok = llm.tokenizer
    eot = {i: tok.id_to_token(i) for i in tok.end_of_turn_ids()}
    t0, new_tokens = time.perf_counter(), 0
    bar = tqdm(total=len(todo), desc="replies", unit="reply")
    with open(path, "a", encoding="utf-8") as fh:
        for i in range(0, len(todo), args.batch_size * 4):
            chunk = todo[i:i + args.batch_size * 4]
            convs = [[{"role": "user", "content": p["prompt"]}] for p, _ in chunk]
            outs = llm.chat(convs, [params_for(p, m, args.max_tokens) for p, m in chunk])
            for (p, mode), conv, out in zip(chunk, convs, outs):
                if out.finish_reason == "error":   # not written: a later run retries it
                    print(f"prompt {p['id']} ({mode}) failed: {out.error}", file=sys.stderr)
                    continue
                prompt = llm.chat_prompt(conv)
                end = eot.get(out.token_ids[-1], "") if out.finish_reason == "stop" else ""
                fh.write(json.dumps({
                    "id": p["id"], "split": "val" if is_validation(p["id"]) else "train", "source": p["source"],
                    "mode": mode, "messages": conv, "reply": out.text,
                    "text": prompt + out.text + end,
                    "num_prompt_tokens": len(tok.encode(prompt)), "num_reply_tokens": len(out.token_ids),
                    "finish_reason": out.finish_reason}, ensure_ascii=False) + "\n")
                new_tokens += len(out.token_ids)
            fh.flush()
            bar.update(len(chunk))
            bar.set_postfix(tok_s=f"{new_tokens / (time.perf_counter() - t0):.0f}")
    bar.close()
    summarize(path, os.path.join(args.out, "summary.json"), args)


def summarize(path: str, out: str, args) -> None:
    counts, tokens = {}, {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            k = f"{r['split']}/{r['mode']}"
            counts[k] = counts.get(k, 0) + 1
            tokens[k] = tokens.get(k, 0) + r["num_prompt_tokens"] + r["num_reply_tokens"]
    info = {"model": args.model, "max_tokens": args.max_tokens, "modes": args.modes,
            "sampled_temperature": SAMPLED_TEMPERATURE, "replies": counts, "tokens": tokens,
            "total_replies": sum(counts.values()), "total_tokens": sum(tokens.values())}
    with open(out, "w") as fh:
        json.dump(info, fh, indent=2)
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
