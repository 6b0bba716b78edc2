"""Training text for MTP heads: files, directories and JSONL records, read as documents
(``train.windows`` tokenizes and packs them).

Documents are split train / validation by a hash of their name (file path relative to
the given root, or ``path:line`` for JSONL records), so a document never straddles the
split and the split does not depend on the machine; a JSONL record's ``split`` field
("train" / "val"), where present, decides instead (corpora split by prompt). A record
whose ``text`` contains its ``reply`` (a chat corpus: the rendered conversation and the
target's reply) marks the text before the reply as its prompt.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from typing import Iterable, List, Sequence, Tuple

from .windows import Document

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


def _record_document(rec: dict, text: str) -> Document:
    """A JSONL record's document: with a ``reply`` inside its text, the text before the
    reply is the prompt and the text ends the turn itself (no end-of-text token added)."""
    reply = rec.get("reply")
    at = text.rfind(reply) if isinstance(reply, str) and reply else -1
    return Document(text, at, end_token=False) if at >= 0 else Document(text)


def _documents(path: str, exclude: Sequence[str]) -> Iterable[Tuple[str, Document, object]]:
    """(key, document, split or None) for every document under ``path``."""
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
                    yield f"{rel}:{i}", _record_document(rec, text), split
        else:
            with open(full, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            if "\0" not in text:
                yield rel, Document(text), None


def read_corpus(paths: Sequence[str], exclude: Sequence[str] = ()) -> Tuple[List[Document], List[Document]]:
    """(train documents, validation documents); a clear error when there is nothing to train on."""
    train, val = [], []
    for path in paths:
        for key, doc, split in _documents(path, exclude):
            if doc.text.strip():
                held_out = is_validation(key) if split is None else split == "val"
                (val if held_out else train).append(doc)
    if not train:
        raise ValueError(f"training data {list(paths)} holds no non-empty text documents")
    if not val:  # tiny corpora: hold out the last document
        if len(train) < 2:
            raise ValueError("training data needs at least two documents (one is held out for validation)")
        val.append(train.pop())
    return train, val

