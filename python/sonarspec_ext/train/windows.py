"""Training windows packed from whole documents, laid out as inference sees them.

Every document (a chat conversation, a file) is tokenized on its own and cut into chunks
of at most ``seq_len`` tokens; chunks are packed into windows one after another and a
window's tail is padding. Each chunk is a *segment*: the feature pass runs it as its own
sequence from position 0 and the head attends within it only - so a conversation's
features are those the target computes when serving it (its chat prompt before it,
nothing of another conversation), not those of a stream cut at arbitrary offsets.

Per token the layout records its position in the segment, the segment's index in the
window (-1: padding) and whether the target's prediction *after* it is one a drafter is
asked for: for a chat record, from the last prompt token on (the reply's tokens, and what
follows the reply); for other documents, everywhere.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np


@dataclass
class Document:
    text: str
    prompt_chars: int = 0     # text[:prompt_chars] is a prompt no drafter is asked to predict
    end_token: bool = True    # append the end-of-text token (documents whose text does not end a turn)


@dataclass
class PackedWindows:
    tokens: np.ndarray      # (n, T) int32, 0 in padding
    positions: np.ndarray   # (n, T) int32: position in the segment (0 in padding)
    segments: np.ndarray    # (n, T) int16: segment index in the window, -1 in padding
    drafted: np.ndarray     # (n, T) bool: the target's next-token prediction here is drafted

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @classmethod
    def uniform(cls, tokens: np.ndarray) -> "PackedWindows":
        """Windows that are each one segment, drafted everywhere (token arrays as they come)."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        n, T = tokens.shape
        return cls(tokens, np.broadcast_to(np.arange(T, dtype=np.int32), (n, T)).copy(),
                   np.zeros((n, T), np.int16), np.ones((n, T), bool))

    def segment_spans(self, i: int) -> List[Tuple[int, int]]:
        """[(start, end)] of window ``i``'s segments, in order."""
        seg = self.segments[i]
        used = int((seg >= 0).sum())
        starts = [0] + (np.flatnonzero(np.diff(seg[:used]) != 0) + 1).tolist()
        return list(zip(starts, starts[1:] + [used]))


def tokenize_documents(tokenizer, docs: Sequence[Document], eot_id: Optional[int]) -> List[Tuple[np.ndarray, int]]:
    """Per document: (token ids, number of prompt tokens). A prompt is tokenized apart from
    the rest, so the boundary falls between tokens."""
    out = []
    for d in docs:
        prompt = tokenizer.encode(d.text[:d.prompt_chars]) if d.prompt_chars else []
        ids = list(prompt) + list(tokenizer.encode(d.text[d.prompt_chars:]))
        if d.end_token and eot_id is not None:
            ids.append(eot_id)
        out.append((np.asarray(ids, dtype=np.int32), len(prompt)))
    return out


def pack_documents(docs: Sequence[Tuple[np.ndarray, int]], seq_len: int, limit: int = 0,
                   seed: int = 0) -> PackedWindows:
    """Documents (``tokenize_documents``) -> windows of ``seq_len``: chunks packed best-fit,
    longest first; with ``limit``, that many windows drawn at random (``seed``). Chunks of
    fewer than two tokens hold no training pair and are left out."""
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    chunks = []
    for ids, num_prompt in docs:
        if len(ids) < 2:
            continue
        chunks += [(ids[lo:lo + seq_len], lo, num_prompt) for lo in range(0, len(ids), seq_len)
                   if len(ids) - lo >= 2]
    if not chunks:
        raise ValueError(f"training data holds no document of two or more tokens for windows of {seq_len}")
    rows: List[list] = []
    free: List[Tuple[int, int]] = []   # (room left, window index), sorted
    for c in sorted(chunks, key=lambda c: -len(c[0])):
        at = bisect.bisect_left(free, (len(c[0]), -1))
        if at == len(free):
            rows.append([c])
            room, w = seq_len - len(c[0]), len(rows) - 1
        else:
            room, w = free.pop(at)
            rows[w].append(c)
            room -= len(c[0])
        if room >= 2:
            bisect.insort(free, (room, w))
    if limit and limit < len(rows):
        keep = np.sort(np.random.default_rng(seed).permutation(len(rows))[:limit])
        rows = [rows[i] for i in keep]
    n = len(rows)
    tokens = np.zeros((n, seq_len), np.int32)
    positions = np.zeros((n, seq_len), np.int32)
    segments = np.full((n, seq_len), -1, np.int16)
    drafted = np.zeros((n, seq_len), bool)
    for i, row in enumerate(rows):
        at = 0
        for s, (chunk, lo, num_prompt) in enumerate(row):
            m = len(chunk)
            tokens[i, at:at + m] = chunk
            positions[i, at:at + m] = np.arange(m)
            segments[i, at:at + m] = s
            drafted[i, at:at + m] = lo + np.arange(m) >= num_prompt - 1
            at += m
    return PackedWindows(tokens, positions, segments, drafted)


def segment_prompts(tokens, segments, drafted, limit: int) -> List[List[int]]:
    """The prompts drafters start from, read off packed windows (``PackedWindows``' arrays
    or a ``FeatureSet``'s tensors): for each segment (a document, or a chunk of a longer
    one), its tokens up to its first drafted prediction - a chat record's whole prompt -
    else its first 32 tokens; at most ``limit``, in window order."""
    out: List[List[int]] = []
    for w in range(len(tokens)):
        tok, seg, dr = (np.asarray(a[w]) for a in (tokens, segments, drafted))
        for s in np.unique(seg[seg >= 0]):
            at = np.flatnonzero(seg == s)
            hits = np.flatnonzero(dr[at])
            n = int(hits[0]) + 1 if len(hits) else 0
            out.append(tok[at][:n if n > 1 else 32].tolist())
            if len(out) == limit:
                return out
    return out
