#!/usr/bin/env python
"""Distil a draft LLM for draft_target speculation from a target's stored features.

The draft is the target cut to its first ``--layers`` decoder layers (weights copied,
then trained) with the target's final norm. It shares the target's token embedding and
tied lm_head (neither is trained nor saved: the engine binds them from the target) and
proposes from a draft vocabulary, the ``--draft-vocab`` most frequent tokens of the
training windows - the rows of the lm_head it computes. Verification stays exact over
the full vocabulary.

Loss: KL(target || draft) over the draft vocabulary at every position, the target's
distribution computed from its final hidden states as stored by the feature pass of
``sonarspec train-mtp`` (``<work>/features/{train,val}``), so the target is not run.
Reports top-1 agreement with the target's own next token (argmax over its full
vocabulary) on held-out windows before, during and after; seeded, checkpointed and
resumable (``--work``); the exported directory holds ``config.json``,
``model.safetensors`` (decoder layers, norm, ``draft_vocab``), the target's tokenizer
and ``training.json``.

    python tools/distill_draft_llm.py --target smollm2 --features runs/smollm2_mtp.work/features \\
        --work runs/smollm2_draft.work --out python/sonarspec_ext/assets/smollm2_draft
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import train_base_models as base  # noqa: E402
from sonarspec_ext.assets import resolve  # noqa: E402
from sonarspec_ext.layers.attention import DenseCausalAttention  # noqa: E402
from sonarspec_ext.models.draft_llm import save_draft_model  # noqa: E402
from sonarspec_ext.models.gguf import open_gguf  # noqa: E402
from sonarspec_ext.models.llama import LlamaForCausalLM  # noqa: E402
from sonarspec_ext.models.loader import checkpoint_fingerprint, gguf_file, load_config, load_tokenizer  # noqa: E402
from sonarspec_ext.models.safetensors_files import load_state  # noqa: E402
from sonarspec_ext.ops.quantized import float_weight  # noqa: E402
from sonarspec_ext.train.features import FeatureSet  # noqa: E402
from sonarspec_ext.train.train_mtp import frequent_tokens, validate_in_engine  # noqa: E402
from sonarspec_ext.train.windows import segment_prompts  # noqa: E402


def target_state(path: str, cfg) -> dict:
    """The target's float32 parameters by name (separate projections)."""
    with torch.device("meta"):
        expected = {n: p.shape for n, p in LlamaForCausalLM(cfg).named_parameters()}
    f = gguf_file(path)
    if f:
        return open_gguf(f).state_dict(cfg, expected, torch.float32, compact=False, quantization="none")
    return load_state(path, expected, torch.float32, keep_bf16_matrices=False)


def build_draft(cfg, state: dict, layers: int) -> LlamaForCausalLM:
    """The target's first ``layers`` decoder layers and final norm, its embedding frozen."""
    draft = LlamaForCausalLM(dataclasses.replace(cfg, num_hidden_layers=layers))
    own = {n: state[n] for n, _ in draft.named_parameters() if n in state}
    draft.load_state_dict(own, strict=False)
    draft.model.embed_tokens.weight.requires_grad_(False)
    return draft


def draft_hidden(draft, tokens: torch.Tensor, layout) -> torch.Tensor:
    """The draft's final hidden states over packed windows (``train.windows``): each
    segment from its own position 0, attending within itself."""
    B, T = tokens.shape
    return draft(tokens.reshape(-1), layout.positions.reshape(-1), DenseCausalAttention(B, T, layout.segments))


@torch.no_grad()
def agreement(draft, val: FeatureSet, w_vocab, vocab_ids, w_full, num_windows: int, batch: int) -> dict:
    """Share of held-out positions where the draft's top token (in its vocabulary) is the
    target's top token (over the full vocabulary), and the KL over the draft vocabulary."""
    draft.eval()
    same = total = kl = 0.0
    for i in range(0, min(num_windows, len(val)), batch):
        idx = torch.arange(i, min(i + batch, num_windows, len(val)))
        (tokens, hidden), layout = val.get(idx), val.layout(idx)
        rows = layout.drafted.reshape(-1)   # never in padding
        h = hidden.reshape(-1, hidden.shape[-1])[rows]
        d = draft_hidden(draft, tokens, layout)[rows] @ w_vocab.T
        same += (vocab_ids[d.argmax(-1)] == (h @ w_full.T).argmax(-1)).sum().item()
        kl += F.kl_div(d.log_softmax(-1), (h @ w_vocab.T).log_softmax(-1), log_target=True, reduction="sum").item()
        total += h.shape[0]
    draft.train()
    return {"top1_agreement": round(same / total, 4), "kl": round(kl / total, 4)}


def export(draft, cfg, vocab_ids, tokenizer, out: str) -> None:
    """The draft (bfloat16) and the target's tokenizer, as a draft model directory."""
    save_draft_model(draft, out, vocab_ids)
    tokenizer._tok.save(os.path.join(out, "tokenizer.json"))
    eos = tokenizer.id_to_token(cfg.eos_token_ids[0])
    with open(os.path.join(out, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos}, fh)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--features", required=True, help="a feature pass's directory (train/ and val/)")
    ap.add_argument("--work", required=True, help="checkpoint directory")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    target_dir = resolve(args.target, "target")
    cfg = load_config(target_dir)
    state = target_state(target_dir, cfg)
    train, val = FeatureSet(os.path.join(args.features, "train")), FeatureSet(os.path.join(args.features, "val"))
    vocab_ids, coverage = frequent_tokens(train.tokens[train.drafted].numpy(), cfg.vocab_size, args.draft_vocab)
    w_full = float_weight(state.get("lm_head.weight", state["model.embed_tokens.weight"]))
    w_vocab = w_full[vocab_ids].contiguous()
    draft = build_draft(cfg, state, args.layers).train()
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    os.makedirs(args.work, exist_ok=True)
    ckpt = os.path.join(args.work, "checkpoint.pt")
    run = base.load_checkpoint(ckpt, draft, opt, {"step": 0, "wall": 0.0, "history": [], "before": None}, "distil")
    evaluate = lambda n: agreement(draft, val, w_vocab, vocab_ids, w_full, n, args.batch_size)  # noqa: E731
    if run["before"] is None:
        run["before"] = evaluate(args.eval_windows)
        print(f"before: {run['before']}")
    clock = base.StepClock(run, args.steps, args.lr, "distil draft", warmup=50)
    for step in clock.steps(opt):
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        idx = torch.randint(0, len(train), (args.batch_size,), generator=g)
        (tokens, hidden), layout = train.get(idx), train.layout(idx)
        rows = layout.drafted.reshape(-1)   # never in padding
        with torch.no_grad():
            teacher = (hidden.reshape(-1, hidden.shape[-1])[rows] @ w_vocab.T).log_softmax(-1)
        logp = (draft_hidden(draft, tokens, layout)[rows] @ w_vocab.T).log_softmax(-1)
        loss = F.kl_div(logp, teacher, log_target=True, reduction="batchmean")
        base.optimizer_step(opt, draft, loss)
        ema = clock.tick(loss.item())
        if run["step"] % args.eval_every == 0 or run["step"] == args.steps:
            run["history"].append({"step": run["step"], "train_kl": round(ema, 4), "wall_s": round(run["wall"], 1),
                                   **evaluate(args.eval_windows // 2)})
            clock.bar.write(json.dumps(run["history"][-1]))
            base.save_checkpoint(ckpt, draft, opt, run)
    after = evaluate(len(val))
    print(f"after: {after}")
    info = {"target": args.target, "target_fingerprint": checkpoint_fingerprint(target_dir), "layers": args.layers,
            "init": f"the target's first {args.layers} layers", "draft_vocab_size": args.draft_vocab, "draft_vocab_coverage": round(coverage, 4),
            "num_trained_params": sum(p.numel() for p in params), "steps": args.steps,
            "batch_size": args.batch_size, "seq_len": int(train.tokens.shape[1]), "peak_lr": args.lr,
            "seed": args.seed, "loss": "KL(target || draft) over the draft vocabulary",
            "train_windows": len(train), "val_windows": len(val), "wall_time_min": round(run["wall"] / 60, 1),
            "before": run["before"], "after": after, "history": run["history"], "torch": torch.__version__}
    export(draft, cfg, vocab_ids, load_tokenizer(target_dir), args.out)
    prompts = segment_prompts(val.tokens, val.segments, val.drafted, 16)
    info["engine_validation"] = validate_in_engine(target_dir, args.out, prompts, 3, 64, method="draft_target")
    with open(os.path.join(args.out, "training.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    print("engine validation (draft_target K = 3): acceptance per position "
          + " ".join(f"{a:.3f}" for a in info["engine_validation"]["accepted_per_position"])
          + f", tau {info['engine_validation']['tau']:.3f}, equal to plain decoding: "
          + str(info["engine_validation"]["equal_to_plain_decoding"]))
    print(f"draft -> {args.out} ({run['wall'] / 60:.1f} min); held-out top-1 agreement with the target "
          f"{run['before']['top1_agreement']} -> {after['top1_agreement']}")


if __name__ == "__main__":
    main()
