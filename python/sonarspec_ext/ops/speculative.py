"""Verification of drafted chains and trees: rejection sampling (lossless) and the greedy path."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from .. import _C
from .checks import check_cuda_build, check_tensor, stream_handle
from .linear import native_threads

_PROB_DTYPES = (torch.float32,)
_CPU = torch.device("cpu")


def _uniforms(uniforms: Optional[torch.Tensor], generator, rows: int, cols: int, dev) -> torch.Tensor:
    """The given (rows, cols) float64 uniforms, checked, or fresh ones from ``generator``."""
    if uniforms is None:
        return torch.rand(rows, cols, dtype=torch.float64, generator=generator, device=dev)
    check_tensor("uniforms", uniforms, dtypes=(torch.float64,), ndim=2, device=dev)
    if tuple(uniforms.shape) != (rows, cols):
        raise ValueError(f"uniforms has shape {list(uniforms.shape)}, expected [{rows}, {cols}]")
    return uniforms


def chain_speculative_sampling(draft_probs: Optional[torch.Tensor], draft_token_ids: torch.Tensor,
                               target_probs: torch.Tensor, *, generator: Optional[torch.Generator] = None,
                               uniforms: Optional[torch.Tensor] = None
                               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rejection-samples drafted chains against the target (FlashInfer semantics), natively
    on the CPU (threads over the batch) or on CUDA (a block per request).

    draft_probs: (batch_size, num_draft_tokens, vocab_size) float32 - the distribution each
    draft was drawn from - or None for point-mass drafts (a greedy drafter; no one-hot rows
    needed); draft_token_ids: (batch_size, num_draft_tokens) int64 or int32; target_probs:
    (batch_size, num_draft_tokens + 1, vocab_size) float32, the processed target
    distributions; uniforms: (batch_size, num_draft_tokens + 1) float64 in [0, 1), drawn
    from ``generator`` when not given.

    Position j is accepted when uniforms[:, j] * q(x_j) < p(x_j); the first rejection is
    replaced by a draw from norm(max(p - q, 0)); if all pass, a bonus token is drawn from
    target_probs[:, -1]; draws use inverse CDF with uniforms[:, -1]. Returns
    ``output_token_ids`` (batch_size, num_draft_tokens + 1) int32 padded with -1,
    ``accepted_num`` (batch_size,) - positions that pass independently - and
    ``emitted_num`` (batch_size,) - the accepted prefix length; tokens emitted per request
    = emitted_num + 1. Output is distributed exactly as sampling from target_probs token by
    token. Same uniforms, same result on CPU, CUDA and ``ops.reference``.
    """
    check_tensor("target_probs", target_probs, dtypes=_PROB_DTYPES, ndim=3)
    dev = target_probs.device
    B, K1, V = target_probs.shape
    K = K1 - 1
    check_tensor("draft_token_ids", draft_token_ids, dtypes=(torch.int64, torch.int32), ndim=2, device=dev)
    draft_token_ids = draft_token_ids.long()   # FlashInfer passes int32 ids
    if tuple(draft_token_ids.shape) != (B, K):
        raise ValueError(f"draft_token_ids has shape {list(draft_token_ids.shape)}, expected [{B}, {K}] "
                         f"(target_probs has {K1} positions)")
    if draft_probs is not None:
        check_tensor("draft_probs", draft_probs, dtypes=_PROB_DTYPES, ndim=3, device=dev)
        if tuple(draft_probs.shape) != (B, K, V):
            raise ValueError(f"draft_probs has shape {list(draft_probs.shape)}, expected [{B}, {K}, {V}]")
    uniforms = _uniforms(uniforms, generator, B, K + 1, dev)
    if dev.type == "cpu" and B and K and (int(draft_token_ids.min()) < 0 or int(draft_token_ids.max()) >= V):
        raise ValueError(f"draft_token_ids must lie in [0, {V})")
    check_cuda_build("chain_speculative_sampling", dev)
    out = torch.empty(B, K + 1, dtype=torch.int64, device=dev)
    accepted, emitted = (torch.empty(B, dtype=torch.int64, device=dev) for _ in range(2))
    _C.chain_speculative_sampling(0 if draft_probs is None else draft_probs.data_ptr(), draft_token_ids.data_ptr(),
                                  target_probs.data_ptr(), uniforms.data_ptr(), out.data_ptr(), accepted.data_ptr(),
                                  emitted.data_ptr(), B, K, V, dev.type == "cuda", stream_handle(dev),
                                  native_threads())
    return out.int(), accepted.int(), emitted.int()


def chain_sampling_from_logits(logits: torch.Tensor, temperature: Sequence[float], top_k: Sequence[int],
                               top_p: Sequence[float], draft_token_ids: Sequence[Sequence[int]],
                               draft_probs: Optional[torch.Tensor], uniforms: Sequence[float]
                               ) -> Tuple[List[List[int]], List[int]]:
    """``chain_speculative_sampling`` from the target's logits, on the CPU: logits (B, K + 1,
    V) float32; request b's rows become ``ops.sampling.processed_probs`` of them with its
    ``temperature[b]`` (> 0), ``top_k[b]`` and ``top_p[b]`` inside the same native call, so no
    (B, K + 1, V) distribution is allocated and filled from Python. ``draft_token_ids`` B
    lists of K ids; ``draft_probs`` (B, K, V) float32 or None (point-mass drafts); uniforms
    B * (K + 1) floats in [0, 1), request by request. K = 0 draws one token per request.
    Returns ``output_token_ids`` (B lists of K + 1, padded with -1) and ``emitted_num`` (B) -
    the tokens ``processed_probs`` followed by ``chain_speculative_sampling`` give with these
    uniforms."""
    check_tensor("logits", logits, dtypes=_PROB_DTYPES, ndim=3, device=_CPU)
    B, K1, V = logits.shape
    if K1 < 1 or V < 1:
        raise ValueError(f"logits has shape {list(logits.shape)}: expected (batch, drafts + 1, vocab)")
    if draft_probs is not None:
        check_tensor("draft_probs", draft_probs, dtypes=_PROB_DTYPES, ndim=3, device=_CPU)
        if tuple(draft_probs.shape) != (B, K1 - 1, V):
            raise ValueError(f"draft_probs has shape {list(draft_probs.shape)}, expected [{B}, {K1 - 1}, {V}]")
    if len(draft_token_ids) != B or any(len(ids) != K1 - 1 for ids in draft_token_ids):
        raise ValueError(f"draft_token_ids must hold {B} lists of {K1 - 1} ids")
    out, emitted = _C.chain_sampling_from_logits(
        logits.data_ptr(), temperature, top_k, top_p, 0 if draft_probs is None else draft_probs.data_ptr(),
        [t for ids in draft_token_ids for t in ids], uniforms, B, K1 - 1, V, native_threads())
    return [out[b * K1:(b + 1) * K1] for b in range(B)], emitted


def tree_speculative_sampling(candidates: torch.Tensor, first_child: torch.Tensor, next_sibling: torch.Tensor,
                              target_probs: torch.Tensor, draft_probs: Optional[torch.Tensor] = None, *,
                              generator: Optional[torch.Generator] = None, uniforms: Optional[torch.Tensor] = None
                              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling over draft trees (lossless), natively on the CPU or CUDA.

    Per request, a tree of N nodes with node 0 the root (the last committed token):
    ``candidates`` (B, N) int64 token of each node (column 0 unused); ``first_child``,
    ``next_sibling`` (B, N) int64 links, -1 for none, siblings tried in list order;
    ``target_probs`` (B, N, V) float32, the processed target distribution after each node;
    ``draft_probs`` (B, N, V) float32, the draft distribution each node's children were
    drawn from (independently, with replacement), or None when the children are distinct
    tokens picked deterministically (top-k); ``uniforms`` (B, N + 1) float64, drawn from
    ``generator`` when not given.

    At a node, child x is accepted when u * q(x) < p(x) (point mass: u < p(x)), the t-th
    child tried using uniforms[:, t]; on rejection p <- norm(max(p - q, 0)) (point mass:
    p(x) <- 0, renormalised) and the next sibling is tried; when all fail (or at a leaf)
    one token is drawn from the current p by inverse CDF with uniforms[:, N]. Returns
    ``output_token_ids`` (B, N) padded with -1 (accepted tokens then the final draw),
    ``accept_index`` (B, N) the accepted path's node indices from the root, padded with
    -1, and ``num_accepted`` (B,).
    """
    check_tensor("target_probs", target_probs, dtypes=_PROB_DTYPES, ndim=3)
    B, N, V = target_probs.shape
    if N < 1 or V < 1:
        raise ValueError(f"target_probs has shape {list(target_probs.shape)}: a tree has at least its root "
                         f"node and the vocabulary at least one token")
    dev = target_probs.device
    for name, t in (("candidates", candidates), ("first_child", first_child), ("next_sibling", next_sibling)):
        check_tensor(name, t, dtypes=(torch.int64,), ndim=2, device=dev)
        if tuple(t.shape) != (B, N):
            raise ValueError(f"{name} has shape {list(t.shape)}, expected [{B}, {N}]")
    if draft_probs is not None:
        check_tensor("draft_probs", draft_probs, dtypes=_PROB_DTYPES, ndim=3, device=dev)
        if tuple(draft_probs.shape) != (B, N, V):
            raise ValueError(f"draft_probs has shape {list(draft_probs.shape)}, expected [{B}, {N}, {V}]")
    uniforms = _uniforms(uniforms, generator, B, N + 1, dev)
    if dev.type == "cpu" and B:   # on CUDA invalid rows come back as all -1 (no host sync)
        if N > 1 and (int(candidates[:, 1:].min()) < 0 or int(candidates[:, 1:].max()) >= V):
            raise ValueError(f"candidates must lie in [0, {V})")
        idx = torch.arange(N)
        for name, t in (("first_child", first_child), ("next_sibling", next_sibling)):
            if bool(((t != -1) & ((t <= idx) | (t >= N))).any()):
                raise ValueError(f"{name} must point to a later node (index in (i, {N})) or be -1")
    check_cuda_build("tree_speculative_sampling", dev)
    out, index = (torch.empty(B, N, dtype=torch.int64, device=dev) for _ in range(2))
    num_accepted = torch.empty(B, dtype=torch.int64, device=dev)
    work = torch.empty(B, V, dtype=torch.float64, device=dev)
    _C.tree_speculative_sampling(candidates.data_ptr(), first_child.data_ptr(), next_sibling.data_ptr(),
                                 target_probs.data_ptr(), 0 if draft_probs is None else draft_probs.data_ptr(),
                                 uniforms.data_ptr(), out.data_ptr(), index.data_ptr(), num_accepted.data_ptr(),
                                 work.data_ptr(), B, N, V, dev.type == "cuda", stream_handle(dev), native_threads())
    return out, index, num_accepted


def greedy_verify(draft_token_ids: torch.Tensor, target_argmax: torch.Tensor) -> Tuple[list, int]:
    """Temperature-0 verification of one chain: draft_token_ids (k,), target_argmax (k + 1,)
    -> (emitted token ids, number of accepted drafts). Accepts while drafts equal the
    target's argmax, then emits the target's token at the first mismatch (or the bonus)."""
    drafts, best = draft_token_ids.tolist(), target_argmax.tolist()
    a = 0
    while a < len(drafts) and drafts[a] == best[a]:
        a += 1
    return best[: a + 1], a
