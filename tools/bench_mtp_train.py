#!/usr/bin/env python
"""MTP head training throughput (tokens per second of one optimizer step: unrolled loss,
backward, AdamW) on real target features, three ways in one process, interleaved:

- ``lm_head per call``: the soft cross-entropy over the full vocabulary through the
  target's lm_head module (bfloat16 weights widened to float32 on every call);
- ``full vocab``: the same loss, the frozen lm_head rows widened once and kept;
- ``draft vocab N``: the loss over the N most frequent tokens of the data only.

    python tools/bench_mtp_train.py --target smollm2 --data runs/chat_corpus/corpus.jsonl
                                    [--draft-vocab 8192] [--unroll 2] [--batch-size 8] [--json PATH]
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

import torch

from sonarspec_ext.assets import resolve
from sonarspec_ext.bench import write_json
from sonarspec_ext.models.loader import checkpoint_fingerprint, load_model, load_tokenizer
from sonarspec_ext.models.mtp import MTPHead
from sonarspec_ext.train.data import read_corpus
from sonarspec_ext.train.features import FeatureSet, compute_features
from sonarspec_ext.train.mtp_train import head_loss
from sonarspec_ext.train.train_mtp import frequent_tokens
from sonarspec_ext.train.windows import pack_documents, tokenize_documents


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--data", nargs="+", required=True)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--unroll", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per mode and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    target_dir = resolve(args.target, "target")
    target, tok = load_model(target_dir), load_tokenizer(target_dir)
    train_docs, _ = read_corpus(args.data)
    every = pack_documents(tokenize_documents(tok, train_docs, tok.eos_token_id), args.seq_len)
    ids, coverage = frequent_tokens(every.tokens[every.drafted], target.config.vocab_size, args.draft_vocab)
    win = every.tokens[:4 * args.batch_size]
    with tempfile.TemporaryDirectory() as work:
        fp = checkpoint_fingerprint(target_dir)
        compute_features(target, win, os.path.join(work, "f"), fp, tok.fingerprint(), "bfloat16", log=lambda *_: None)
        fs = FeatureSet(os.path.join(work, "f"), fp)
        cfg = copy.deepcopy(target.config)
        cfg.num_hidden_layers = 1
        modes = {"lm_head per call": None, "full vocab": None, f"draft vocab {args.draft_vocab}": ids}
        heads = {}
        for name in modes:
            torch.manual_seed(0)
            head = MTPHead(cfg, "rmsnorm").bind(target)
            if name == "lm_head per call":   # the module path: weights widened on every call
                head.training_logits = lambda f, v=None, h=head: h._shared[1](f).float()
            heads[name] = (head, torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-4))
        times = {name: [] for name in modes}
        for _ in range(args.rounds):
            for name, vocab in modes.items():
                head, opt = heads[name]
                for step in range(args.steps + 1):
                    idx = torch.arange(step * args.batch_size, (step + 1) * args.batch_size) % len(fs)
                    tokens, hidden = fs.get(idx)
                    t0 = time.perf_counter()
                    loss, _ = head_loss(head, tokens, hidden, args.unroll, 0.1, vocab_ids=vocab)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    if step:   # the first step of a round warms up
                        times[name].append(tokens.numel() / (time.perf_counter() - t0))
    results = {name: round(statistics.median(t), 1) for name, t in times.items()}
    base = results["lm_head per call"]
    for name, tok_s in results.items():
        print(f"{name:>20}: {tok_s:8.1f} tokens/s  ({tok_s / base:.2f}x)")
    print(f"draft vocabulary of {args.draft_vocab}: {coverage:.1%} of the data's tokens", file=sys.stderr)
    if args.json:
        write_json({"target": target_dir, "unroll": args.unroll, "batch_size": args.batch_size,
                    "seq_len": args.seq_len, "threads": torch.get_num_threads(), "draft_vocab": args.draft_vocab,
                    "draft_vocab_coverage": coverage, "tokens_per_s": results}, args.json)


if __name__ == "__main__":
    main()
