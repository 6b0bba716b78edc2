"""Feature pass: the target's final hidden states over training windows, computed with
the engine's own inference path (``ModelRunner`` on a paged KV cache) and stored as
sharded safetensors with an index and a manifest.

    <dir>/manifest.json            target / tokenizer fingerprints, dtype, shapes
    <dir>/index.json               shards and their window counts (written last)
    <dir>/shard-00000.safetensors  tokens (n, T) int32, hidden (n, T, H)

Shards are written atomically; an interrupted pass resumes at the first missing shard.
A directory made for another target or tokenizer is refused.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ..runtime.kv_cache import KVCache
from ..runtime.runner import ModelRunner
from ..models.loader import parse_dtype

SHARD_WINDOWS = 256


def _manifest(target_fp: str, tokenizer_fp: str, dtype: torch.dtype, windows: np.ndarray, hidden: int) -> dict:
    return {"target_fingerprint": target_fp, "tokenizer_fingerprint": tokenizer_fp,
            "dtype": str(dtype).replace("torch.", ""), "num_windows": int(windows.shape[0]),
            "seq_len": int(windows.shape[1]), "hidden_size": hidden,
            "tokens_sha": _sha(windows)}


def _sha(a: np.ndarray) -> str:
    import hashlib
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def compute_features(target, windows: np.ndarray, out_dir: str, target_fp: str, tokenizer_fp: str,
                     dtype="bfloat16", batch_windows: int = 8, page_size: int = 16,
                     log=print) -> dict:
    """Runs ``target`` over ``windows`` (num_windows, T) and stores the hidden states in
    ``out_dir``; returns the index. Resumes an interrupted pass; refuses a directory made
    for another target, tokenizer or token data."""
    store_dtype = parse_dtype(dtype)
    n, T = windows.shape
    H = target.config.hidden_size
    manifest = _manifest(target_fp, tokenizer_fp, store_dtype, windows, H)
    os.makedirs(out_dir, exist_ok=True)
    mpath = os.path.join(out_dir, "manifest.json")
    if os.path.isfile(mpath):
        with open(mpath) as fh:
            old = json.load(fh)
        if old != manifest:
            diff = [k for k in manifest if old.get(k) != manifest[k]]
            raise ValueError(f"{out_dir} holds features made for a different setup ({', '.join(diff)} differ); "
                             f"use another directory or delete it")
    else:
        with open(mpath, "w") as fh:
            json.dump(manifest, fh, indent=2)
    shards = [(i, min(n, i + SHARD_WINDOWS)) for i in range(0, n, SHARD_WINDOWS)]
    elem = torch.empty((), dtype=store_dtype).element_size()
    log(f"feature pass: {n} windows x {T} tokens, hidden {H}, {dtype}: "
        f"{n * T * (H * elem + 4) / 2**20:.1f} MiB in {len(shards)} shard(s) under {out_dir}")
    pages_per_window = -(-T // page_size)
    # the KV pool holds activations (float32 for compact, bfloat16-weight models)
    kv = KVCache(target.config, pages_per_window * batch_windows, page_size, target.compute_dtype,
                 target.lm_head.weight.device)
    runner = ModelRunner(target, kv)
    bar = tqdm(total=n, desc="features", unit="win", dynamic_ncols=True)
    entries = []
    for s, (lo, hi) in enumerate(shards):
        name = f"shard-{s:05d}.safetensors"
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            bar.update(hi - lo)
        else:
            parts = []
            for b in range(lo, hi, batch_windows):
                parts.append(_run(runner, windows[b:min(hi, b + batch_windows)], pages_per_window))
                bar.update(parts[-1].shape[0])
            hidden = torch.cat(parts)
            tmp = path + ".tmp"
            save_file({"tokens": torch.from_numpy(np.ascontiguousarray(windows[lo:hi])),
                       "hidden": hidden.to(store_dtype).contiguous()}, tmp)
            os.replace(tmp, path)
        entries.append({"file": name, "num_windows": hi - lo})
    bar.close()
    index = {"shards": entries, **manifest}
    with open(os.path.join(out_dir, "index.json"), "w") as fh:
        json.dump(index, fh, indent=2)
    return index


def _run(runner: ModelRunner, win: np.ndarray, pages_per_window: int) -> torch.Tensor:
    """Prefills a batch of windows from position 0 -> final hidden states (b, T, H)."""
    b, T = win.shape
    rows = [(0, T, list(range(i * pages_per_window, (i + 1) * pages_per_window))) for i in range(b)]
    device = runner.device
    meta, positions = runner.metadata(rows)
    ids = torch.from_numpy(win.astype(np.int64).reshape(-1)).to(device)
    _, hidden = runner.forward(ids, positions, meta, torch.zeros(0, dtype=torch.long, device=device),
                               hidden_indices=slice(None))
    return hidden.view(b, T, -1).float().cpu()


class FeatureSet:
    """Reads a finished feature directory: ``len()`` windows, ``get(indices)`` ->
    (tokens (b, T) int64, hidden (b, T, H) float32)."""

    def __init__(self, path: str, target_fp: Optional[str] = None):
        ipath = os.path.join(path, "index.json")
        if not os.path.isfile(ipath):
            raise ValueError(f"{path}: no index.json - the feature pass has not finished")
        with open(ipath) as fh:
            self.index = json.load(fh)
        if target_fp is not None and self.index["target_fingerprint"] != target_fp:
            raise ValueError(f"{path}: features were computed by another target "
                             f"({self.index['target_fingerprint']} != {target_fp})")
        tokens, hidden = [], []
        for e in self.index["shards"]:
            d = load_file(os.path.join(path, e["file"]))
            tokens.append(d["tokens"])
            hidden.append(d["hidden"])
        self.tokens = torch.cat(tokens).long()
        self.hidden = torch.cat(hidden)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def get(self, idx: torch.Tensor):
        return self.tokens[idx], self.hidden[idx].float()
