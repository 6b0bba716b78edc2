"""Training loop for an MTP head on precomputed target features.

Only the head trains; embedding and lm_head are the target's, frozen and never saved
with the head. Per unroll step k (weight 0.8^(k-1)):

    SmoothL1(f_hat_i, h_{i+1}) + w * soft-CE(lm_head(f_hat_i), softmax(lm_head(h_{i+1})))

over the rows whose prediction is drafted (``unroll.valid_rows``: inside one segment of a
packed window, past a chat record's prompt).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..models.mtp import MTPHead
from .features import FeatureSet
from .unroll import UnrollAttention, WindowLayout, valid_rows


@dataclass
class TrainConfig:
    max_steps: int = 1000
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    ce_weight: float = 0.1
    unroll: int = 1
    noise: float = 0.1            # uniform feature noise U(-noise, noise) on the target features
    seed: int = 0
    eval_every: int = 100
    eval_windows: int = 64
    checkpoint_every: int = 100


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup)
    return cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def unrolled_features(head: MTPHead, tokens: torch.Tensor, hidden: torch.Tensor, unroll: int,
                      noise: float = 0.0, generator: Optional[torch.Generator] = None,
                      layout: Optional[WindowLayout] = None):
    """tokens (B, T), hidden (B, T, H) -> one (B, T-1, H) output per unroll step; row i of
    step k predicts the feature at i + 1 (valid where ``valid_rows``). ``layout``: the
    windows' segments (None: one per window)."""
    B, T = tokens.shape
    T1, H = T - 1, hidden.shape[-1]
    ids = tokens[:, 1:].reshape(-1)                                   # t_{i+1} at position i
    if layout is None:
        positions, segments = torch.arange(T1).repeat(B), None
    else:
        positions, segments = layout.positions[:, :-1].reshape(-1), layout.segments[:, :-1]
    feats = hidden[:, :-1]
    if noise:
        feats = feats + (torch.rand(feats.shape, generator=generator) * 2 - 1) * noise
    attn, outs = UnrollAttention(B, T1, segments), []
    for _ in range(unroll):
        outs.append(head(ids, positions, attn, feats.reshape(-1, H)).view(B, T1, H))
        feats = torch.cat([torch.zeros(B, 1, H), outs[-1][:, :-1]], dim=1)  # step k+1 at i reads step k at i-1
    return outs


def head_loss(head: MTPHead, tokens: torch.Tensor, hidden: torch.Tensor, unroll: int, ce_weight: float,
              noise: float = 0.0, generator: Optional[torch.Generator] = None,
              vocab_ids: Optional[torch.Tensor] = None, layout: Optional[WindowLayout] = None,
              streams: Optional[torch.Tensor] = None):
    """tokens (B, T), hidden (B, T, H) -> (total loss, [per-step (feature loss, CE, top-1 acc)]).
    ``vocab_ids``: the soft cross-entropy (and top-1) over these tokens only - the draft
    vocabulary the head will propose from - with the teacher renormalised over them.
    ``layout``: the windows' segments and drafted positions (None: one segment, all drafted).
    ``streams`` (B, T, layers, H): the residual streams a fused head reads at its first step
    (its features, ``MTPHead.target_features``); later steps and the targets stay ``hidden``."""
    B, T = tokens.shape
    layout = layout or WindowLayout.uniform(B, T)
    H = hidden.shape[-1]
    target = hidden[:, 1:].reshape(-1, H)                             # h_{i+1}
    with torch.no_grad():
        teacher = head.training_logits(target, vocab_ids).log_softmax(-1)
    inputs = hidden
    if head.feature_layers:
        if streams is None:
            raise ValueError(f"this head reads target layers {list(head.feature_layers)}: the features need "
                             f"their streams (a feature pass with those layers)")
        inputs = head.target_features(hidden.reshape(-1, H), streams.reshape(B * T, -1, H)).view(B, T, H)
    total, parts = 0.0, []
    for k, out in enumerate(unrolled_features(head, tokens, inputs, unroll, noise, generator, layout), start=1):
        rows = valid_rows(k, layout).reshape(-1)
        if not rows.any():   # no chain of this length in the batch
            parts.append((0.0, 0.0, 0.0))
            continue
        o = out.reshape(-1, H)[rows]
        feat_loss = F.smooth_l1_loss(o, target[rows])
        logp = head.training_logits(o, vocab_ids).log_softmax(-1)
        tp = teacher[rows]
        ce = -(tp.exp() * logp).sum(-1).mean()
        total = total + 0.8 ** (k - 1) * (feat_loss + ce_weight * ce)
        acc = (logp.argmax(-1) == tp.argmax(-1)).float().mean()
        parts.append((feat_loss.item(), ce.item(), acc.item()))
    return total, parts


@torch.no_grad()
def evaluate(head: MTPHead, val: FeatureSet, cfg: TrainConfig, vocab_ids: Optional[torch.Tensor] = None) -> dict:
    head.eval()
    n = min(len(val), cfg.eval_windows)
    sums = None
    for lo in range(0, n, cfg.batch_size):
        idx = torch.arange(lo, min(n, lo + cfg.batch_size))
        tokens, hidden = val.get(idx)
        loss, parts = head_loss(head, tokens, hidden, cfg.unroll, cfg.ce_weight, vocab_ids=vocab_ids,
                                layout=val.layout(idx), streams=val.streams(idx))
        row = [len(idx) * x for x in [float(loss)] + [x for p in parts for x in p]]
        sums = row if sums is None else [a + b for a, b in zip(sums, row)]
    head.train()
    avg = [s / n for s in sums]
    return {"loss": avg[0], "feature_loss": avg[1::3], "ce": avg[2::3], "top1": avg[3::3]}


# What a resumed run may change: its length (the learning-rate schedule then follows the
# new max_steps from the step reached) and how often it evaluates and checkpoints.
EXTENDABLE = frozenset({"max_steps", "eval_every", "checkpoint_every", "eval_windows"})


def train_head(head: MTPHead, train: FeatureSet, val: FeatureSet, cfg: TrainConfig, work_dir: str,
               resume: bool = False, log: Callable[[str], None] = print,
               vocab_ids: Optional[torch.Tensor] = None) -> dict:
    """Trains ``head`` (bound to its frozen target) and returns the history; checkpoints to
    ``work_dir/checkpoint.pt`` and continues from it with ``resume`` - also past the end
    of a finished run, given a larger ``max_steps`` (``EXTENDABLE``). ``vocab_ids``: the
    cross-entropy's token set (see ``head_loss``)."""
    for fs in (train, val):
        if tuple(fs.feature_layers) != tuple(head.feature_layers):
            raise ValueError(f"the head reads target layers {list(head.feature_layers)}, the features hold "
                             f"{list(fs.feature_layers)}")
    os.makedirs(work_dir, exist_ok=True)
    ckpt = os.path.join(work_dir, "checkpoint.pt")
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    history = {"config": asdict(cfg), "train": [], "val": []}
    start = 0
    if resume and os.path.isfile(ckpt):
        state = torch.load(ckpt, weights_only=False)
        changed = sorted(k for k, v in asdict(cfg).items() if state["config"].get(k) != v)
        if set(changed) - EXTENDABLE or cfg.max_steps < state["step"]:
            raise ValueError(f"{ckpt} was written with another training configuration ({', '.join(changed)} "
                             f"differ; only {', '.join(sorted(EXTENDABLE))} may change, max_steps to no fewer "
                             f"than the {state['step']} steps done); start a new run in another directory or "
                             f"drop --resume")
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["optimizer"])
        history, start = state["history"], state["step"]
        history["config"] = asdict(cfg)
        log(f"resumed from {ckpt} at step {start}" + (f" (now {cfg.max_steps} steps)" if "max_steps" in changed
                                                     else ""))
    head.train()
    bar = tqdm(total=cfg.max_steps, initial=start, desc=f"train mtp ({head.layout})", unit="step",
               dynamic_ncols=True)
    t0, ema = time.perf_counter(), None
    for step in range(start, cfg.max_steps):
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        idx = torch.randint(0, len(train), (cfg.batch_size,), generator=g)
        tokens, hidden = train.get(idx)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss, parts = head_loss(head, tokens, hidden, cfg.unroll, cfg.ce_weight, cfg.noise, g, vocab_ids,
                                train.layout(idx), train.streams(idx))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        history["train"].append({"step": step + 1, "loss": loss.item(), "top1": parts[0][2]})
        tok_s = (step + 1 - start) * tokens.numel() / (time.perf_counter() - t0)
        bar.set_postfix(loss=f"{ema:.3f}", top1=f"{parts[0][2]:.2f}", tok_s=f"{tok_s:.0f}")
        bar.update(1)
        done = step + 1 == cfg.max_steps
        if (step + 1) % cfg.eval_every == 0 or done:
            ev = evaluate(head, val, cfg, vocab_ids)
            history["val"].append({"step": step + 1, **ev})
            bar.write(f"step {step + 1}: val loss {ev['loss']:.4f}, top-1 per step "
                      + " ".join(f"{a:.3f}" for a in ev["top1"]))
        if (step + 1) % cfg.checkpoint_every == 0 or done:
            tmp = ckpt + ".tmp"
            torch.save({"head": head.state_dict(), "optimizer": opt.state_dict(), "step": step + 1,
                        "config": asdict(cfg), "history": history}, tmp)
            os.replace(tmp, ckpt)
    bar.close()
    with open(os.path.join(work_dir, "history.json"), "w") as fh:
        json.dump(history, fh)
    return history
