#!/usr/bin/env python
"""Train the packaged default models end to end: tokenizer, target and draft.

Corpus: the Python standard library of the running interpreter (no test suites, no
site-packages), split train/validation by a hash of each file's relative path.
Models are trained with sonarspec's own Llama modules (autograd on the inference code),
seeded and resumable; each exported directory gets a ``training.json``.

    python tools/train_base_models.py --work runs/base --out python/sonarspec_ext/assets
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import sysconfig
import time

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from sonarspec_ext.layers.attention import DenseCausalAttention  # noqa: E402
from sonarspec_ext.models.config import ModelConfig  # noqa: E402
from sonarspec_ext.models.llama import LlamaForCausalLM  # noqa: E402
from sonarspec_ext.models.loader import save_model  # noqa: E402
from sonarspec_ext.train.data import is_validation  # noqa: E402  (about 5% of files)

EOT = "<|endoftext|>"
TEST_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "testing"}

MODELS = {
    # name: architecture, optimisation
    "target": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=4,
                   num_key_value_heads=2, steps=1800, lr=1.5e-3),
    "draft": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, steps=1500, lr=2e-3),
}
VOCAB_SIZE, SEQ_LEN, BATCH_SIZE, MAX_POSITIONS = 8192, 512, 8, 1024


def corpus_files(root: str):
    """(relative path, absolute path) of every stdlib .py file outside test suites."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in TEST_DIRS and not d.startswith("test"))
        for f in sorted(filenames):
            if f.endswith(".py") and not f.startswith("test_"):
                full = os.path.join(dirpath, f)
                out.append((os.path.relpath(full, root), full))
    return out


def read_corpus(root: str):
    train, val = [], []
    for rel, full in corpus_files(root):
        with open(full, encoding="utf-8", errors="replace") as fh:
            (val if is_validation(rel) else train).append(fh.read())
    if not train or not val:
        raise SystemExit(f"corpus at {root} is empty or has no validation files")
    return train, val


def train_tokenizer(texts, path: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOT], show_progress=True,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(path)
    return tok


def encode(tok, texts) -> np.ndarray:
    eot = tok.token_to_id(EOT)
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eot)
    return np.asarray(ids, dtype=np.int32)


def write_tokenizer_files(out: str, tok_path: str):
    import shutil
    shutil.copy(tok_path, os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOT, "bos_token": EOT,
                   "unk_token": EOT, "model_max_length": MAX_POSITIONS, "clean_up_tokenization_spaces": False},
                  fh, indent=2)


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def batch(data: np.ndarray, step: int, seed: int):
    g = np.random.default_rng([seed, step])
    starts = g.integers(0, len(data) - SEQ_LEN - 1, size=BATCH_SIZE)
    x = np.stack([data[s:s + SEQ_LEN + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(x)


def load_checkpoint(path: str, model, opt, state: dict, name: str) -> dict:
    """The training state saved at ``path`` (model and optimizer restored), or ``state``."""
    if not os.path.isfile(path):
        return state
    ck = torch.load(path, weights_only=False)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    print(f"[{name}] resumed at step {ck['state']['step']}")
    return ck["state"]


def save_checkpoint(path: str, model, opt, state: dict) -> None:
    """Written to a temporary file first, so an interrupted save leaves the last one intact."""
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, path + ".tmp")
    os.replace(path + ".tmp", path)


class StepClock:
    """A training loop's bookkeeping over ``state`` (``"step"``, ``"wall"``): ``steps(opt)``
    yields the remaining step numbers with each step's learning rate set (``lr_at``) on a
    progress bar, ``tick(loss)`` after each step adds its wall time, counts it and returns
    the smoothed loss (EMA 0.95), shown on the bar."""

    def __init__(self, state: dict, total: int, peak_lr: float, desc: str, warmup: int = 100):
        self.state, self.total, self.peak_lr, self.warmup = state, total, peak_lr, warmup
        self.bar = tqdm(total=total, initial=state["step"], desc=desc, unit="step", dynamic_ncols=True)
        self.last, self.ema = time.time(), None

    def steps(self, opt):
        while self.state["step"] < self.total:
            step = self.state["step"]
            for group in opt.param_groups:
                group["lr"] = lr_at(step, self.total, self.peak_lr, self.warmup)
            yield step
        self.bar.close()

    def tick(self, loss: float, **shown) -> float:
        now = time.time()
        self.state["wall"] += now - self.last
        self.last = now
        self.state["step"] += 1
        self.ema = loss if self.ema is None else 0.95 * self.ema + 0.05 * loss
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{self.ema:.3f}", **shown)
        return self.ema


def optimizer_step(opt, model, loss: torch.Tensor) -> None:
    """Backward, clip the gradient norm to 1, step (the base models' and the distillation's)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def loss_on(model, x: torch.Tensor) -> torch.Tensor:
    B, T = x.shape[0], x.shape[1] - 1
    pos = torch.arange(T).repeat(B)
    h = model(x[:, :-1].reshape(-1), pos, DenseCausalAttention(B, T))
    return F.cross_entropy(model.compute_logits(h), x[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model, data: np.ndarray, max_windows: int = 10_000) -> float:
    model.eval()
    n = min(max_windows, (len(data) - 1) // SEQ_LEN)
    total = 0.0
    for i in range(0, n, BATCH_SIZE):
        rows = [data[j * SEQ_LEN: j * SEQ_LEN + SEQ_LEN + 1] for j in range(i, min(n, i + BATCH_SIZE))]
        x = torch.from_numpy(np.stack(rows).astype(np.int64))
        total += loss_on(model, x).item() * len(rows)
    model.train()
    return total / n


def train_model(name: str, spec: dict, eot: int, train_data, val_data, work: str, out: str, seed: int):
    spec = dict(spec)
    steps, peak = spec.pop("steps"), spec.pop("lr")
    cfg = ModelConfig(vocab_size=VOCAB_SIZE, head_dim=spec["hidden_size"] // spec["num_attention_heads"],
                      max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=True, eos_token_ids=[eot], bos_token_id=eot, **spec)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    for n, p in model.named_parameters():
        if p.dim() == 2:
            std = 0.02 / math.sqrt(2 * cfg.num_hidden_layers) if n.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            torch.nn.init.normal_(p, std=std)
    opt = torch.optim.AdamW(model.parameters(), lr=peak, betas=(0.9, 0.95), weight_decay=0.1)
    ckpt_path = os.path.join(work, f"{name}.ckpt.pt")
    state = load_checkpoint(ckpt_path, model, opt, {"step": 0, "tokens": 0, "wall": 0.0, "history": []}, name)
    model.train()
    clock = StepClock(state, steps, peak, f"train {name}")
    for step in clock.steps(opt):
        loss = loss_on(model, batch(train_data, step, seed))
        optimizer_step(opt, model, loss)
        state["tokens"] += BATCH_SIZE * SEQ_LEN
        ema = clock.tick(loss.item(), tok_s=f"{state['tokens'] / max(state['wall'], 1e-9):.0f}")
        if state["step"] % 50 == 0:
            state["history"].append({"step": state["step"], "train_loss": round(ema, 4),
                                     "tokens": state["tokens"], "wall_s": round(state["wall"], 1)})
        if state["step"] % 100 == 0 or state["step"] == steps:
            save_checkpoint(ckpt_path, model, opt, state)
    val_loss = evaluate(model, val_data)
    train_loss = evaluate(model, train_data, max_windows=200)
    save_model(model, out, dtype="bfloat16")
    info = {"name": name, "config": cfg.to_hf_dict(), "num_params": cfg.num_params, "seed": seed,
            "steps": steps, "batch_size": BATCH_SIZE, "seq_len": SEQ_LEN, "peak_lr": peak,
            "tokens_seen": state["tokens"], "wall_time_s": round(state["wall"], 1),
            "train_loss": round(train_loss, 4), "val_loss": round(val_loss, 4),
            "val_perplexity": round(math.exp(val_loss), 3), "torch": torch.__version__,
            "history": state["history"]}
    with open(os.path.join(out, "training.json"), "w") as fh:
        json.dump(info, fh, indent=2)
    print(f"[{name}] val loss {val_loss:.4f} (ppl {math.exp(val_loss):.2f}), {state['tokens']} tokens, "
          f"{state['wall'] / 60:.1f} min -> {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="runs/base", help="checkpoints, tokenizer and token caches")
    ap.add_argument("--out", default="python/sonarspec_ext/assets", help="where target/ and draft/ are written")
    ap.add_argument("--models", nargs="+", default=["target", "draft"], choices=sorted(MODELS))
    ap.add_argument("--steps-scale", type=float, default=1.0, help="multiply step counts (quick runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.work, exist_ok=True)
    tok_path = os.path.join(args.work, "tokenizer.json")
    root = sysconfig.get_paths()["stdlib"]
    train_texts, val_texts = read_corpus(root)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path) if os.path.isfile(tok_path) else train_tokenizer(train_texts, tok_path)
    eot = tok.token_to_id(EOT)
    cache = os.path.join(args.work, "tokens.npz")
    if os.path.isfile(cache):
        z = np.load(cache)
        train_data, val_data = z["train"], z["val"]
    else:
        train_data, val_data = encode(tok, train_texts), encode(tok, val_texts)
        np.savez(cache, train=train_data, val=val_data)
    print(f"corpus {root}: {len(train_texts)} train / {len(val_texts)} validation files, "
          f"{len(train_data)} / {len(val_data)} tokens")
    for name in args.models:
        spec = dict(MODELS[name])
        spec["steps"] = max(1, int(spec["steps"] * args.steps_scale))
        out = os.path.join(args.out, name)
        train_model(name, spec, eot, train_data, val_data, args.work, out, args.seed)
        write_tokenizer_files(out, tok_path)


if __name__ == "__main__":
    main()
