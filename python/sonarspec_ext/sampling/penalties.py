"""Repetition, frequency and presence penalties and logit bias: a request's target logits
changed by the tokens before each row, as vLLM and OpenAI define them.

For a row whose preceding tokens are the prompt P and the output O so far:
``repetition_penalty`` r divides the positive logits and multiplies the others of every
token in P or O (r > 1 discourages repeats); then ``frequency_penalty`` f and
``presence_penalty`` p subtract ``f * count_O(t) + p * [t in O]``; then ``logit_bias``
adds its fixed values. Under speculation a drafted row's O includes the drafts before it
(a chain's earlier drafts, a tree node's ancestors): the verification compares the
drafts against exactly the distributions plain decoding would sample from, so the
output stays the target's. All penalized rows of a step change in one gather-and-scatter
and one accumulating scatter, whatever their number.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch


def row_drafts(draft) -> List[List[int]]:
    """The drafted tokens before each of a block's logits rows (after the sequence's
    output): none for the first, then a chain's drafts in turn, or a tree node's path."""
    if draft is None:
        return [[]]
    if draft.tree is None:
        return [list(draft.token_ids[:j]) for j in range(len(draft.token_ids) + 1)]
    tree, paths = draft.tree, [[]]
    for i in range(1, len(tree)):
        paths.append(paths[tree.parents[i]] + [tree.tokens[i]])
    return paths


class TokenCounts:
    """A request's tokens as the penalties read them, brought up to date as its output
    grows (outputs only grow): the prompt's distinct ids, each output token's count, and
    the output tokens not in the prompt, once each in order of appearance."""

    def __init__(self, prompt_ids: Sequence[int]):
        self.prompt = np.unique(np.asarray(prompt_ids, dtype=np.int64))
        self._in_prompt = set(self.prompt.tolist())
        self.counts: Dict[int, int] = {}
        self.fresh: List[int] = []
        self._read = 0
        self._factors = None   # (output tokens read, factors)

    def update(self, output_ids: Sequence[int]) -> "TokenCounts":
        for t in output_ids[self._read:]:
            if t not in self.counts and t not in self._in_prompt:
                self.fresh.append(t)
            self.counts[t] = self.counts.get(t, 0) + 1
        self._read = len(output_ids)
        return self

    def seen(self, t: int) -> bool:
        return t in self.counts or t in self._in_prompt

    def factors(self, params) -> Tuple[np.ndarray, np.ndarray]:
        """How a drafter applies ``params``' penalties and bias to its logits, from the tokens
        so far: (token ids, ascending; (3, n) float32 per id: the multiplier of a positive
        logit, of the others, and the value added after). Other tokens keep their logits.
        Cached until the output grows."""
        if self._factors is not None and self._factors[0] == self._read:
            return self._factors[1]
        seen = np.concatenate([self.prompt, np.asarray(self.fresh, dtype=np.int64)])
        bias = np.fromiter((params.logit_bias or {}).keys(), dtype=np.int64)
        ids = np.unique(np.concatenate([seen, bias]))
        vals = np.ones((3, ids.size), dtype=np.float32)
        vals[2] = 0.0
        at = np.searchsorted(ids, seen)
        vals[0, at], vals[1, at] = 1.0 / params.repetition_penalty, params.repetition_penalty
        n = len(self.counts)
        out = np.fromiter(self.counts.keys(), dtype=np.int64, count=n)
        counts = np.fromiter(self.counts.values(), dtype=np.float64, count=n)
        vals[2, np.searchsorted(ids, out)] -= params.frequency_penalty * counts + params.presence_penalty
        if bias.size:
            vals[2, np.searchsorted(ids, bias)] += np.fromiter(params.logit_bias.values(), dtype=np.float64)
        self._factors = (self._read, (ids, vals))
        return ids, vals


def factor_rows(factors: Tuple[np.ndarray, np.ndarray], row_tokens: Optional[np.ndarray], rows: int) -> np.ndarray:
    """``TokenCounts.factors`` over logits rows: (3, rows) float32, row r standing for
    token ``row_tokens[r]`` (ascending), or r without; rows of other tokens unchanged."""
    ids, vals = factors
    out = np.empty((3, rows), dtype=np.float32)
    out[:2], out[2] = 1.0, 0.0
    if row_tokens is None:
        keep = ids < rows
        out[:, ids[keep]] = vals[:, keep]
        return out
    at = np.minimum(np.searchsorted(row_tokens[:rows], ids), rows - 1)
    keep = row_tokens[at] == ids
    out[:, at[keep]] = vals[:, keep]
    return out


def token_counts(seq) -> TokenCounts:
    """A request's ``TokenCounts`` (made at its first use), brought up to date."""
    if seq.token_counts is None:
        seq.token_counts = TokenCounts(seq.prompt_ids)
    return seq.token_counts.update(seq.output_ids)


def penalize_draft_logits(logits: torch.Tensor, seq) -> torch.Tensor:
    """A drafter's logits (..., vocab) over the target's vocabulary with ``seq``'s
    penalties and bias applied as ``TokenCounts.factors`` gives them (a new tensor;
    ``logits`` itself for a request without any)."""
    if not seq.params.penalized:
        return logits
    f = torch.from_numpy(factor_rows(token_counts(seq).factors(seq.params), None, logits.shape[-1])).to(logits.device)
    return logits * torch.where(logits > 0, f[0], f[1]) + f[2]


def _block_entries(tokens: TokenCounts, drafts: Sequence[Sequence[int]], params, base: int, vocab: int,
                   scaled: List[np.ndarray], factors: List[np.ndarray], added: List[np.ndarray],
                   values: List[np.ndarray]) -> None:
    """One block's changes as flat indices into the step's logits (its rows from ``base``,
    row i after the prompt and output of ``tokens``, then ``drafts[i]``): those the
    repetition penalty scales (``scaled``, by ``factors``; each once per row) and the
    values added to the rest (``added``, ``values``: penalties negative, bias as given)."""
    rows = len(drafts)
    starts = base + np.arange(rows, dtype=np.int64)[:, None] * vocab
    r, f, p = params.repetition_penalty, params.frequency_penalty, params.presence_penalty
    if r != 1.0:
        seen = np.concatenate([tokens.prompt, np.asarray(tokens.fresh, dtype=np.int64)])
        new = [base + i * vocab + t for i, extra in enumerate(drafts) for t in set(extra) if not tokens.seen(t)]
        idx = np.concatenate([(starts + seen).ravel(), np.asarray(new, dtype=np.int64)])
        scaled.append(idx)
        factors.append(np.full(idx.size, r))
    if f or p:
        n = len(tokens.counts)
        ids = np.fromiter(tokens.counts.keys(), dtype=np.int64, count=n)
        counts = np.fromiter(tokens.counts.values(), dtype=np.float64, count=n)
        added.append((starts + ids).ravel())
        values.append(np.tile(-(f * counts + p), rows))
        extra_idx, extra_val = [], []
        for i, extra in enumerate(drafts):   # each drafted token: f more, and p where it is new
            for t in extra:
                extra_idx.append(base + i * vocab + t)
                extra_val.append(-f)
            for t in set(extra):
                if t not in tokens.counts:
                    extra_idx.append(base + i * vocab + t)
                    extra_val.append(-p)
        added.append(np.asarray(extra_idx, dtype=np.int64))
        values.append(np.asarray(extra_val, dtype=np.float64))
    if params.logit_bias:
        ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64)
        added.append((starts + ids).ravel())
        values.append(np.tile(np.fromiter(params.logit_bias.values(), dtype=np.float64), rows))


def apply_penalties(logits: torch.Tensor, blocks) -> Dict[int, torch.Tensor]:
    """Penalizes in place the logits rows (n, vocab; contiguous) of every block
    (``engine.blocks.Block``) whose request asks for penalties or bias - one gather and
    scatter for the repetition penalties and one accumulating scatter for the rest, for
    all blocks together. Returns, by sequence id, the raw rows of those requests that also
    ask for log-probabilities (reported under the target's own distribution)."""
    raw, vocab = {}, logits.shape[-1]
    scaled, factors, added, values = [], [], [], []
    for b in blocks:
        seq = b.seq
        if not (b.at_end and seq.params.penalized):
            continue
        if seq.logprobs is not None:
            raw[seq.seq_id] = logits[b.logits_offset:b.logits_offset + b.num_logits].clone()
        _block_entries(token_counts(seq), row_drafts(b.draft), seq.params,
                       b.logits_offset * vocab, vocab, scaled, factors, added, values)
    if not (scaled or added):
        return raw
    empty = [np.zeros(0, dtype=np.int64)]
    with torch.inference_mode():   # the forward's logits are inference tensors
        flat = logits.view(-1)
        at = torch.from_numpy(np.concatenate(scaled or empty)).to(logits.device)
        r = torch.from_numpy(np.concatenate(factors or [np.zeros(0)])).to(logits)
        x = flat[at]
        flat[at] = torch.where(x > 0, x / r, x * r)
        at = torch.from_numpy(np.concatenate(added or empty)).to(logits.device)
        flat.index_put_((at,), torch.from_numpy(np.concatenate(values or [np.zeros(0)])).to(logits), accumulate=True)
    return raw
