"""Training text for MTP heads: files, directories and JSONL, tokenized into windows.

Documents are split train / validation by a hash of their name (file path relative to
the given root, or ``path:line`` for JSONL records), so a document never straddles the
split and the split does not depend on the machine; a JSONL record's ``split`` field
("train" / "val"), where present, decides instead (corpora split by prompt).
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".c", ".h", ".cpp", ".js", ".ts", ".go", ".rs", ".java", ".json")


def is_validation(key: str, every: int = 20) -> bool:
    """About 1 in ``every`` documents is held out, chosen by a hash of its name."""
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % every == 0


def _walk(root: str, exclude: Sequence[str]) -> Iterable[Tuple[str, str]]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for f in sorted(filenames):
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, root)
            if (f.endswith(TEXT_SUFFIXES) or f.endswith(".jsonl")) and not any(
                    fnmatch.fnmatch(rel, pat) for pat in exclude):
                yield rel, full


def _documents(path: str, exclude: Sequence[str]) -> Iterable[Tuple[str, str, Optional[str]]]:
    """(key, text, split or None) for every document under ``path``."""
    if os.path.isdir(path):
        files = list(_walk(path, exclude))
    elif os.path.isfile(path):
        files = [(os.path.basename(path), path)]
    else:
        raise ValueError(f"training data {path!r}: no such file or directory")
    for rel, full in files:
        if full.endswith(".jsonl"):
            with open(full, encoding="utf-8") as fh:
                for i, line in enumerate(fh):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                        text = rec["text"]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        raise ValueError(f"{full}:{i + 1}: expected a JSON object with a 'text' field") from None
                    if not isinstance(text, str):
                        raise ValueError(f"{full}:{i + 1}: 'text' must be a string")
                    split = rec.get("split")
                    if split not in (None, "train", "val"):
                        raise ValueError(f"{full}:{i + 1}: 'split' must be 'train' or 'val', got {split!r}")
                    yield f"{rel}:{i}", text, split
        else:
            with open(full, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            if "\0" not in text:
                yield rel, text, None


def read_corpus(paths: Sequence[str], exclude: Sequence[str] = ()) -> Tuple[List[str], List[str]]:
    """(train texts, validation texts); a clear error when there is nothing to train on."""
    train, val = [], []
    for path in paths:
        for key, text, split in _documents(path, exclude):
            if text.strip():
                held_out = is_validation(key) if split is None else split == "val"
                (val if held_out else train).append(text)
    if not train:
        raise ValueError(f"training data {list(paths)} holds no non-empty text documents")
    if not val:  # tiny corpora: hold out the last document
        if len(train) < 2:
            raise ValueError("training data needs at least two documents (one is held out for validation)")
        val.append(train.pop())
    return train, val


def tokenize(tokenizer, texts: Sequence[str], eot_id) -> np.ndarray:
    """One int32 token stream: documents joined by the end-of-text token when there is one."""
    ids: List[int] = []
    for t in texts:
        ids.extend(tokenizer.encode(t))
        if eot_id is not None:
            ids.append(eot_id)
    return np.asarray(ids, dtype=np.int32)


def windows(stream: np.ndarray, length: int, limit: int = 0) -> np.ndarray:
    """Non-overlapping windows (num_windows, length) from a token stream."""
    n = len(stream) // length
    if limit:
        n = min(n, limit)
    if n == 0:
        raise ValueError(f"training data has {len(stream)} tokens, fewer than one window of {length}")
    return stream[:n * length].reshape(n, length)
