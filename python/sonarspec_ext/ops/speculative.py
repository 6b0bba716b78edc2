"""Verification of drafted chains and trees: rejection sampling (lossless) and the greedy path."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .checks import check_tensor
from .reference import chain_speculative_sampling_reference, tree_speculative_sampling_reference

_PROB_DTYPES = (torch.float32, torch.float64)


def chain_speculative_sampling(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor,
                               target_probs: torch.Tensor, *, generator: Optional[torch.Generator] = None
                               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rejection-samples drafted chains against the target (FlashInfer semantics).

    draft_probs: (batch_size, num_draft_tokens, vocab_size) - the draft distribution each
    token was drawn from (a one-hot row for a greedy drafter); draft_token_ids:
    (batch_size, num_draft_tokens) int64/int32; target_probs: (batch_size,
    num_draft_tokens + 1, vocab_size), the processed target distributions.

    Position j is accepted when u * q(x_j) < p(x_j), u ~ U[0, 1) in float64; the first
    rejection is replaced by a draw from norm(max(p - q, 0)); if all pass, a bonus token is
    drawn from target_probs[:, -1]. Returns ``output_token_ids`` (batch_size,
    num_draft_tokens + 1) int32 padded with -1, ``accepted_num`` (batch_size,) - positions
    that pass independently - and ``emitted_num`` (batch_size,) - the accepted prefix
    length; tokens emitted per request = emitted_num + 1. Output is distributed exactly
    as sampling from target_probs token by token.
    """
    check_tensor("draft_probs", draft_probs, dtypes=_PROB_DTYPES, ndim=3, contiguous=False)
    dev = draft_probs.device
    check_tensor("draft_token_ids", draft_token_ids, dtypes=(torch.int64, torch.int32), ndim=2, device=dev,
                 contiguous=False)
    check_tensor("target_probs", target_probs, dtypes=_PROB_DTYPES, ndim=3, device=dev, contiguous=False)
    B, K, V = draft_probs.shape
    if tuple(draft_token_ids.shape) != (B, K):
        raise ValueError(f"draft_token_ids has shape {list(draft_token_ids.shape)}, expected [{B}, {K}]")
    if tuple(target_probs.shape) != (B, K + 1, V):
        raise ValueError(f"target_probs has shape {list(target_probs.shape)}, expected [{B}, {K + 1}, {V}]")
    if B and K and (int(draft_token_ids.min()) < 0 or int(draft_token_ids.max()) >= V):
        raise ValueError(f"draft_token_ids must lie in [0, {V})")
    return chain_speculative_sampling_reference(draft_probs.cpu(), draft_token_ids.cpu(), target_probs.cpu(),
                                                generator)


def tree_speculative_sampling(candidates: torch.Tensor, first_child: torch.Tensor, next_sibling: torch.Tensor,
                              target_probs: torch.Tensor, draft_probs: Optional[torch.Tensor] = None, *,
                              generator: Optional[torch.Generator] = None
                              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling over draft trees (lossless).

    Per request, a tree of N nodes with node 0 the root (the last committed token):
    ``candidates`` (B, N) token of each node (column 0 unused); ``first_child``,
    ``next_sibling`` (B, N) int64 links, -1 for none, siblings tried in list order;
    ``target_probs`` (B, N, V) the processed target distribution after each node;
    ``draft_probs`` (B, N, V) the draft distribution each node's children were drawn from
    (independently, with replacement), or None when the children are distinct tokens
    picked deterministically (top-k).

    At a node, child x is accepted when u * q(x) < p(x) (point mass: u < p(x)); on
    rejection p <- norm(max(p - q, 0)) (point mass: p(x) <- 0, renormalised) and the next
    sibling is tried; when all fail (or at a leaf) one token is drawn from the current p.
    Returns ``output_token_ids`` (B, N) padded with -1 (accepted tokens then the final
    draw), ``accept_index`` (B, N) the accepted path's node indices from the root, padded
    with -1, and ``num_accepted`` (B,).
    """
    check_tensor("target_probs", target_probs, dtypes=_PROB_DTYPES, ndim=3, contiguous=False)
    B, N, V = target_probs.shape
    dev = target_probs.device
    for name, t in (("candidates", candidates), ("first_child", first_child), ("next_sibling", next_sibling)):
        check_tensor(name, t, dtypes=(torch.int64, torch.int32), ndim=2, device=dev, contiguous=False)
        if tuple(t.shape) != (B, N):
            raise ValueError(f"{name} has shape {list(t.shape)}, expected [{B}, {N}]")
    if draft_probs is not None:
        check_tensor("draft_probs", draft_probs, dtypes=_PROB_DTYPES, ndim=3, device=dev, contiguous=False)
        if tuple(draft_probs.shape) != (B, N, V):
            raise ValueError(f"draft_probs has shape {list(draft_probs.shape)}, expected [{B}, {N}, {V}]")
    if B and N > 1 and (int(candidates[:, 1:].min()) < 0 or int(candidates[:, 1:].max()) >= V):
        raise ValueError(f"candidates must lie in [0, {V})")
    for name, t in (("first_child", first_child), ("next_sibling", next_sibling)):
        idx = torch.arange(N, device=dev)
        if B and bool(((t != -1) & ((t <= idx) | (t >= N))).any()):
            raise ValueError(f"{name} must point to a later node (index in (i, {N})) or be -1")
    return tree_speculative_sampling_reference(
        candidates.cpu(), first_child.cpu(), next_sibling.cpu(), target_probs.cpu(),
        None if draft_probs is None else draft_probs.cpu(), generator)


def greedy_verify(draft_token_ids: torch.Tensor, target_argmax: torch.Tensor) -> Tuple[list, int]:
    """Temperature-0 verification of one chain: draft_token_ids (k,), target_argmax (k + 1,)
    -> (emitted token ids, number of accepted drafts). Accepts while drafts equal the
    target's argmax, then emits the target's token at the first mismatch (or the bonus)."""
    drafts, best = draft_token_ids.tolist(), target_argmax.tolist()
    a = 0
    while a < len(drafts) and drafts[a] == best[a]:
        a += 1
    return best[: a + 1], a
