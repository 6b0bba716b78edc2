#!/usr/bin/env python
"""Distil the packaged draft model from the packaged target.

The draft (trained on the corpus alone by tools/train_base_models.py) is trained further
to match the target's next-token distributions: loss KL(target || draft) on the same
corpus windows, the target run without gradients alongside. What speculation needs from
a draft is agreement with the target, which the corpus loss only approximates. Reports
the draft's top-1 agreement with the target and its corpus loss on validation windows
before and after, seeded and resumable; the exported directory gets a ``training.json``.

    python tools/distill_draft.py --work runs/base --out python/sonarspec_ext/assets/draft
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import train_base_models as base  # noqa: E402
from sonarspec_ext.assets import resolve  # noqa: E402
from sonarspec_ext.layers.attention import DenseCausalAttention  # noqa: E402
from sonarspec_ext.models.config import ModelConfig  # noqa: E402
from sonarspec_ext.models.llama import LlamaForCausalLM  # noqa: E402
from sonarspec_ext.models.loader import load_model, save_model  # noqa: E402
from sonarspec_ext.models.safetensors_files import load_state  # noqa: E402

SEQ_LEN, BATCH = 256, 8


def trainable(path: str) -> LlamaForCausalLM:
    """A float32 model with separate (unfused) projections, for autograd."""
    model = LlamaForCausalLM(ModelConfig.from_dir(path))
    expected = {n: p.shape for n, p in model.named_parameters()}
    state = load_state(path, expected, torch.float32, keep_bf16_matrices=False)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model.load_state_dict(state, strict=False)
    return model


def windows(data: np.ndarray, step: int, seed: int) -> torch.Tensor:
    g = np.random.default_rng([seed, step])
    starts = g.integers(0, len(data) - SEQ_LEN, size=BATCH)
    return torch.from_numpy(np.stack([data[s:s + SEQ_LEN] for s in starts]).astype(np.int64))


def logits_of(model, x: torch.Tensor) -> torch.Tensor:
    B, T = x.shape
    h = model(x.reshape(-1), torch.arange(T).repeat(B), DenseCausalAttention(B, T))
    return model.compute_logits(h)


@torch.no_grad()
def agreement(draft, target, data: np.ndarray, num_windows: int = 48) -> dict:
    """Top-1 agreement with the target and corpus cross-entropy on fixed validation windows."""
    draft.eval()
    n = min(num_windows, (len(data) - 1) // (SEQ_LEN + 1))
    rows = np.stack([data[i * (SEQ_LEN + 1):(i + 1) * (SEQ_LEN + 1)] for i in range(n)]).astype(np.int64)
    same = total = ce = 0.0
    for i in range(0, n, BATCH):
        x = torch.from_numpy(rows[i:i + BATCH])
        d, t = logits_of(draft, x[:, :-1]), logits_of(target, x[:, :-1])
        same += (d.argmax(-1) == t.argmax(-1)).sum().item()
        total += d.shape[0]
        ce += F.cross_entropy(d, x[:, 1:].reshape(-1), reduction="sum").item()
    draft.train()
    return {"top1_agreement": round(same / total, 4), "val_loss": round(ce / total, 4)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="runs/base", help="token cache (from train_base_models.py) and checkpoint")
    ap.add_argument("--target", default="default")
    ap.add_argument("--draft", default="default", help="the draft to start from")
    ap.add_argument("--out", required=True, help="directory for the distilled draft")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cache = os.path.join(args.work, "tokens.npz")
    if not os.path.isfile(cache):
        raise SystemExit(f"{cache} not found: run tools/train_base_models.py --work {args.work} first")
    z = np.load(cache)
    train_data, val_data = z["train"], z["val"]
    target_dir, draft_dir = resolve(args.target, "target"), resolve(args.draft, "draft")
    target = load_model(target_dir, "float32", "cpu", compact_weights=False)   # inference only
    draft = trainable(draft_dir).train()
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    ckpt = os.path.join(args.work, "draft_distill.ckpt.pt")
    state = base.load_checkpoint(ckpt, draft, opt, {"step": 0, "wall": 0.0, "history": [], "before": None}, "distil")
    if state["before"] is None:
        state["before"] = agreement(draft, target, val_data)
        print(f"before: {state['before']}")
    torch.manual_seed(args.seed)
    clock = base.StepClock(state, args.steps, args.lr, "distil draft", warmup=50)
    for step in clock.steps(opt):
        x = windows(train_data, step, args.seed)
        with torch.no_grad():
            t_logp = F.log_softmax(logits_of(target, x), -1)
        d_logp = F.log_softmax(logits_of(draft, x), -1)
        loss = F.kl_div(d_logp, t_logp, log_target=True, reduction="batchmean")
        base.optimizer_step(opt, draft, loss)
        ema = clock.tick(loss.item())
        if state["step"] % 100 == 0 or state["step"] == args.steps:
            state["history"].append({"step": state["step"], "kl": round(ema, 4), "wall_s": round(state["wall"], 1),
                                     **agreement(draft, target, val_data, num_windows=16)})
            base.save_checkpoint(ckpt, draft, opt, state)
    after = agreement(draft, target, val_data)
    print(f"after: {after}")
    with open(os.path.join(draft_dir, "training.json")) as fh:   # read before --out may overwrite it
        info = json.load(fh)
    tokenizer = os.path.join(args.work, "draft_tokenizer.json")
    shutil.copy(os.path.join(draft_dir, "tokenizer.json"), tokenizer)
    save_model(draft, args.out, dtype="bfloat16")
    base.write_tokenizer_files(args.out, tokenizer)
    if "pretraining" not in info:   # a second distillation keeps the corpus-only losses
        info["pretraining"] = {k: info[k] for k in ("train_loss", "val_loss", "val_perplexity")}
    info["val_loss"] = round(base.evaluate(draft, val_data), 4)   # the corpus losses of the distilled draft
    info["val_perplexity"] = round(math.exp(info["val_loss"]), 3)
    info["train_loss"] = round(base.evaluate(draft, train_data, max_windows=200), 4)
    info["distillation"] = {"from_target": os.path.basename(os.path.normpath(target_dir)), "steps": args.steps,
                            "batch_size": BATCH, "seq_len": SEQ_LEN, "peak_lr": args.lr, "seed": args.seed,
                            "loss": "KL(target || draft)", "wall_time_s": round(state["wall"], 1),
                            "before": state["before"], "after": after, "history": state["history"],
                            "torch": torch.__version__}
    with open(os.path.join(args.out, "training.json"), "w") as fh:
        json.dump(info, fh, indent=2)
    print(f"distilled draft -> {args.out} ({state['wall'] / 60:.1f} min); val top-1 agreement with the target "
          f"{state['before']['top1_agreement']} -> {after['top1_agreement']}")


if __name__ == "__main__":
    main()
