"""Feature pass: the target's final hidden states over training windows, computed with
the engine's own inference path (``ModelRunner`` on a paged KV cache; each segment of a
window - ``train.windows`` - its own sequence from position 0) and stored as sharded
safetensors with an index and a manifest.

    <dir>/manifest.json            target / tokenizer fingerprints, dtype, shapes
    <dir>/index.json               shards and their window counts (written last)
    <dir>/shard-00000.safetensors  tokens (n, T) int32, hidden (n, T, H) (zero in padding),
                                   positions int32, segments int16, drafted uint8 (n, T);
                                   with feature layers, streams (n, T, layers, H): the
                                   residual streams after those layers (fused heads)

Shards are written atomically; an interrupted pass resumes at the first missing shard.
A directory made for another target or tokenizer is refused.
"""
from __future__ import annotations

import json
import os
from typing import Optional, Sequence, Union

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ..runtime.kv_cache import KVCache
from ..runtime.runner import ModelRunner
from ..models.loader import parse_dtype
from .unroll import WindowLayout
from .windows import PackedWindows

SHARD_WINDOWS = 256


def _manifest(target_fp: str, tokenizer_fp: str, dtype: torch.dtype, win: PackedWindows, hidden: int,
              feature_layers: Sequence[int]) -> dict:
    out = {"target_fingerprint": target_fp, "tokenizer_fingerprint": tokenizer_fp,
           "dtype": str(dtype).replace("torch.", ""), "num_windows": len(win),
           "seq_len": int(win.tokens.shape[1]), "hidden_size": hidden,
           "tokens_sha": _sha(win.tokens), "layout_sha": _sha(win.segments, win.positions, win.drafted)}
    if feature_layers:
        out["feature_layers"] = [int(x) for x in feature_layers]
    return out


def _sha(*arrays: np.ndarray) -> str:
    import hashlib
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def _layout_tensors(win: PackedWindows, lo: int, hi: int) -> dict:
    return {"positions": torch.from_numpy(np.ascontiguousarray(win.positions[lo:hi])),
            "segments": torch.from_numpy(np.ascontiguousarray(win.segments[lo:hi])),
            "drafted": torch.from_numpy(np.ascontiguousarray(win.drafted[lo:hi]).astype(np.uint8))}


def compute_features(target, windows: Union[PackedWindows, np.ndarray], out_dir: str, target_fp: str,
                     tokenizer_fp: str, dtype="bfloat16", batch_windows: int = 8, page_size: int = 16,
                     log=print, feature_layers: Sequence[int] = ()) -> dict:
    """Runs ``target`` over ``windows`` (``PackedWindows``, or a (num_windows, T) token array:
    one segment per window) and stores the hidden states in ``out_dir`` (and the residual
    streams after ``feature_layers``); returns the index. Resumes an interrupted pass;
    refuses a directory made for another target, tokenizer, token data or layers."""
    win = windows if isinstance(windows, PackedWindows) else PackedWindows.uniform(windows)
    store_dtype = parse_dtype(dtype)
    n, T = win.tokens.shape
    H = target.config.hidden_size
    manifest = _manifest(target_fp, tokenizer_fp, store_dtype, win, H, feature_layers)
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
    per_token = (1 + len(feature_layers)) * H * elem + 4
    log(f"feature pass: {n} windows x {T} tokens, hidden {H}, {dtype}"
        + (f", layers {list(feature_layers)}" if feature_layers else "")
        + f": {n * T * per_token / 2**20:.1f} MiB in {len(shards)} shard(s) under {out_dir}")
    spans = [win.segment_spans(i) for i in range(n)]
    pages_per_window = max(sum(-(-(e - s) // page_size) for s, e in sp) for sp in spans)
    # the KV pool holds activations (float32 for compact, bfloat16-weight models)
    kv = KVCache(target.config, pages_per_window * batch_windows, page_size, target.compute_dtype,
                 target.lm_head.weight.device)
    runner = ModelRunner(target, kv)
    runner.fuse_layers(feature_layers, lambda final, streams: torch.cat([final[:, None], streams], dim=1))
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
                top = min(hi, b + batch_windows)
                parts.append(prefill_hidden(runner, win.tokens[b:top], spans[b:top], page_size))
                bar.update(parts[-1].shape[0])
            hidden = torch.cat(parts).to(store_dtype)   # (n, T, H), or (n, T, 1 + layers, H)
            streams = {} if hidden.dim() == 3 else {"streams": hidden[:, :, 1:].contiguous()}
            tmp = path + ".tmp"
            save_file({"tokens": torch.from_numpy(np.ascontiguousarray(win.tokens[lo:hi])),
                       "hidden": (hidden if hidden.dim() == 3 else hidden[:, :, 0]).contiguous(), **streams,
                       **_layout_tensors(win, lo, hi)}, tmp)
            os.replace(tmp, path)
        entries.append({"file": name, "num_windows": hi - lo})
    bar.close()
    index = {"shards": entries, **manifest}
    with open(os.path.join(out_dir, "index.json"), "w") as fh:
        json.dump(index, fh, indent=2)
    return index


def prefill_hidden(runner: ModelRunner, tokens: np.ndarray, spans, page_size: int) -> torch.Tensor:
    """Prefills every segment of a batch of windows as its own sequence from position 0 ->
    the runner's hidden states (b, T, ...), zero in padding."""
    b, T = tokens.shape
    rows, ids, page = [], [], 0
    for i in range(b):
        for s, e in spans[i]:
            pages = -(-(e - s) // page_size)
            rows.append((0, e - s, list(range(page, page + pages))))
            ids.append(tokens[i, s:e])
            page += pages
    device = runner.device
    meta, positions = runner.metadata(rows)
    ids = torch.from_numpy(np.concatenate(ids).astype(np.int64)).to(device)
    _, hidden = runner.forward(ids, positions, meta, torch.zeros(0, dtype=torch.long, device=device),
                               hidden_indices=slice(None))
    out = torch.zeros(b, T, *hidden.shape[1:])
    at = 0
    for i in range(b):
        used = spans[i][-1][1]
        out[i, :used] = hidden[at:at + used].float().cpu()
        at += used
    return out


class FeatureSet:
    """Reads a finished feature directory: ``len()`` windows, ``get(indices)`` ->
    (tokens (b, T) int64, hidden (b, T, H) float32), ``streams(indices)`` -> the residual
    streams after ``feature_layers`` (b, T, layers, H) float32 or None, ``layout(indices)``
    -> their ``WindowLayout``."""

    def __init__(self, path: str, target_fp: Optional[str] = None):
        ipath = os.path.join(path, "index.json")
        if not os.path.isfile(ipath):
            raise ValueError(f"{path}: no index.json - the feature pass has not finished")
        with open(ipath) as fh:
            self.index = json.load(fh)
        if target_fp is not None and self.index["target_fingerprint"] != target_fp:
            raise ValueError(f"{path}: features were computed by another target "
                             f"({self.index['target_fingerprint']} != {target_fp})")
        self.feature_layers = tuple(self.index.get("feature_layers", ()))
        keys = ("tokens", "hidden", "positions", "segments", "drafted") + (("streams",) if self.feature_layers else ())
        parts = {k: [] for k in keys}
        for e in self.index["shards"]:
            d = load_file(os.path.join(path, e["file"]))
            for k, v in parts.items():
                if k not in d:
                    raise ValueError(f"{path}: {e['file']} has no {k!r} tensor (features of an older layout): "
                                     f"delete the directory and run the feature pass again")
                v.append(d[k])
        self.tokens = torch.cat(parts["tokens"]).long()
        self.hidden = torch.cat(parts["hidden"])
        self.positions = torch.cat(parts["positions"]).long()
        self.segments = torch.cat(parts["segments"]).long()
        self.drafted = torch.cat(parts["drafted"]).bool()
        self._streams = torch.cat(parts["streams"]) if self.feature_layers else None

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def get(self, idx: torch.Tensor):
        return self.tokens[idx], self.hidden[idx].float()

    def streams(self, idx: torch.Tensor) -> Optional[torch.Tensor]:
        return None if self._streams is None else self._streams[idx].float()

    def layout(self, idx: torch.Tensor) -> WindowLayout:
        return WindowLayout(self.positions[idx], self.segments[idx], self.drafted[idx])
