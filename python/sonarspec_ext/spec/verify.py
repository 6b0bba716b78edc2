"""Verifies one sequence's drafted chain or tree against its target logits.

Each sampled request brings its ``source`` of uniforms (``engine.request.Request``, or
``sampling.uniforms.GeneratorUniforms`` / ``KeyedUniforms``). Unseeded requests are
rejection-sampled: ``verify_chain_device`` keeps everything on the device (no host
synchronisation) and draws exactly as ``ops.chain_speculative_sampling`` and its
reference do for one row: K + 1 float64 uniforms, K acceptance tests, one inverse-CDF
draw. Seeded requests (``source.keyed_sampling``) are verified by coupling: the target's
token at each position is its inverse-CDF draw at that position's keyed uniform, and a
draft is accepted while it equals that token (``sampling.uniforms``).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from .. import ops
from ..sampling.sampler import draw_rows, inverse_cdf, processed_probs, sample_chains, top_tokens
from .proposer import Draft


def verify_chain_device(target_logits: torch.Tensor, draft_ids: torch.Tensor, draft_probs: Optional[torch.Tensor],
                        params, source) -> Tuple[torch.Tensor, torch.Tensor]:
    """``target_logits`` (k + 1, V) float32 at the sequence's last token and each draft;
    ``draft_ids`` (k,) int64; ``draft_probs`` (k, V) or None for point-mass drafts.
    Returns device tensors (tokens (k + 1,), accepted ()): the emitted tokens are
    ``tokens[:accepted + 1]``, the last being the correction or bonus token."""
    k, V = draft_ids.shape[0], target_logits.shape[-1]
    if params.greedy:
        best = target_logits.argmax(-1)
        return best, (draft_ids == best[:k]).long().cumprod(0).sum()
    p = processed_probs(target_logits, params)
    if source.keyed_sampling:
        best = draw_rows(p, source.uniforms(0, k + 1))
        return best, (draft_ids == best[:k]).long().cumprod(0).sum()
    q = draft_probs if draft_probs is not None else torch.nn.functional.one_hot(draft_ids, V).float()
    u = source.uniforms(0, k + 1)
    px = p[:k].gather(1, draft_ids[:, None])[:, 0].double()
    qx = q.gather(1, draft_ids[:, None])[:, 0].double()
    accepted = (u[:k] * qx < px).long().cumprod(0).sum()
    row_p = p.index_select(0, accepted.view(1))[0].double()
    row_q = torch.cat([q, q.new_zeros(1, V)]).index_select(0, accepted.view(1))[0].double()  # no q: bonus
    residual = (row_p - row_q).clamp_min(0)
    residual = torch.where(residual.sum() > 0, residual, row_p)   # p == q up to rounding
    tok = inverse_cdf(residual, u[k])
    tokens = torch.cat([draft_ids, draft_ids.new_zeros(1)]).scatter(0, accepted.view(1), tok.view(1))
    return tokens, accepted


def verify_chain(target_logits: torch.Tensor, draft: Draft, params, source) -> Tuple[List[int], int]:
    """Host-side result of ``verify_chain_device``: (emitted token ids, number of accepted
    drafts); between 1 and len(draft) + 1 tokens are emitted."""
    if params.greedy:   # the host needs the tokens anyway: one read of the top tokens, compared there
        return _greedy_result(top_tokens(target_logits), draft.token_ids)
    ids = torch.tensor(draft.token_ids, dtype=torch.long, device=target_logits.device)
    tokens, accepted = verify_chain_device(target_logits, ids, draft.probs, params, source)
    a = int(accepted)
    return tokens[:a + 1].tolist(), a


def _greedy_result(best: List[int], draft_ids: List[int]) -> Tuple[List[int], int]:
    """Greedy verification from the target's top tokens at the last token and each draft."""
    a = 0
    while a < len(draft_ids) and draft_ids[a] == best[a]:
        a += 1
    return best[:a + 1], a


def verify_chains(items: List[Tuple[torch.Tensor, Draft, object, object]],
                  tops: Optional[List[Optional[List[int]]]] = None) -> List[Tuple[List[int], int]]:
    """``verify_chain`` for many sequences at once: ``items`` are (target_logits, draft,
    params, source); ``tops``, per item, the top tokens of its logits rows where they are
    known already (or None; a greedy item with them needs no target_logits: None).
    Rejection-sampled chains of one length go through one ``sampling.sampler.sample_chains``
    call (on the CPU one native call from the logits), their uniforms drawn from each
    request's source as ``verify_chain_device`` draws them, so the results are the same;
    coupled chains (seeded requests) draw all their rows in one call."""
    results: List[Optional[Tuple[List[int], int]]] = [None] * len(items)
    tops = list(tops) if tops else [None] * len(items)
    greedy = [i for i, it in enumerate(items) if it[2].greedy]
    unknown = [i for i in greedy if tops[i] is None]
    best = top_tokens(joined_rows([items[i][0] for i in unknown])) if unknown else []   # in one read
    row = 0
    for i in greedy:
        draft_ids = items[i][1].token_ids
        if tops[i] is None:
            tops[i], row = best[row:row + len(draft_ids) + 1], row + len(draft_ids) + 1
        results[i] = _greedy_result(tops[i], draft_ids)
    groups, keyed = {}, []
    for i, (logits, draft, params, source) in enumerate(items):
        if params.greedy:
            continue
        if logits.device.type == "cuda" and not ops.built_with_cuda():
            results[i] = verify_chain(logits, draft, params, source)
        elif source.keyed_sampling:
            keyed.append(i)
        else:
            groups.setdefault((len(draft.token_ids), draft.probs is not None), []).append(i)
    for (k, has_q), idx in groups.items():
        q = _stacked([items[i][1].probs for i in idx]) if has_q else None
        q = q.float() if q is not None and q.dtype != torch.float32 else q
        us = [items[i][3].uniforms(0, k + 1) for i in idx]
        u = us[0] if len(us) == 1 else torch.cat(us)
        chains = sample_chains(joined_rows([items[i][0] for i in idx]), [items[i][2] for i in idx],
                               [items[i][1].token_ids for i in idx], q, u)
        for i, result in zip(idx, chains):
            results[i] = result
    if keyed:
        _verify_coupled(items, keyed, results)
    return results


def _stacked(tensors: List[torch.Tensor]) -> torch.Tensor:
    """``tensors`` (of one shape) stacked along a new first dimension, contiguous: one view
    for a single contiguous tensor (a batch-1 step; each torch call costs tens of
    microseconds after a forward has streamed the weights through the caches)."""
    t = tensors[0]
    return t[None] if len(tensors) == 1 and t.is_contiguous() else torch.stack(tensors)


def _verify_coupled(items, idx: List[int], results: list) -> None:
    """Coupled verification of the chains ``items[i]``, i in ``idx`` (seeded requests): the
    target's draw at every row from one ``sample_chains`` call (a chain of no drafts per
    row), each chain then accepted while its drafts equal those draws."""
    lengths = [len(items[i][1].token_ids) + 1 for i in idx]
    best = [t[0] for t, _ in sample_chains(joined_rows([items[i][0] for i in idx]),
                                           [items[i][2] for i, n in zip(idx, lengths) for _ in range(n)],
                                           [[]] * sum(lengths), None,
                                           torch.cat([items[i][3].uniforms(0, n) for i, n in zip(idx, lengths)]))]
    row = 0
    for i, n in zip(idx, lengths):
        results[i], row = _greedy_result(best[row:row + n], items[i][1].token_ids), row + n


def joined_rows(blocks: List[torch.Tensor]) -> torch.Tensor:
    """The rows of ``blocks`` (2-D, of one width) in order as one tensor: a view where they
    lie back to back in one storage (the blocks of a step's logits, the usual case: a copy
    of a batch of 64 rows of a 49152-token vocabulary costs milliseconds), else a copy."""
    first = blocks[0]
    if len(blocks) == 1:
        return first
    width = first.shape[-1]
    ptr, rows = first.data_ptr(), 0
    for b in blocks:   # contiguous rows of `width` values, each block right after the one before
        if (b.dim() != 2 or not b.is_contiguous() or b.shape[1] != width
                or b.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or b.data_ptr() != ptr + rows * width * b.element_size()):
            return torch.cat(blocks)
        rows += b.shape[0]
    return first.as_strided((rows, width), (width, 1), first.storage_offset())


def verify_tree(target_logits: torch.Tensor, draft: Draft, params, source) -> Tuple[List[int], List[int]]:
    """``target_logits`` (n, V) at the root and each node of ``draft.tree`` -> (emitted
    token ids, accepted node indices along the path). Greedy follows the child equal to
    the target's argmax, coupled sampling (seeded requests) the child equal to the
    target's keyed draw at each depth; otherwise recursive rejection sampling over
    siblings (the tree's children are distinct top-k tokens: point-mass drafts)."""
    tree = draft.tree
    first, nxt = tree.links()
    if params.greedy or source.keyed_sampling:
        best = top_tokens(target_logits) if params.greedy else None
        tokens, path, node = [], [], 0
        while True:
            tok = best[node] if best is not None else int(draw_rows(
                processed_probs(target_logits[node:node + 1], params), source.uniforms(len(path), 1))[0])
            child = int(first[node])
            while child != -1 and tree.tokens[child] != tok:
                child = int(nxt[child])
            tokens.append(tok)
            if child == -1:
                return tokens, path
            path.append(child)
            node = child
    p = processed_probs(target_logits, params)
    dev = p.device
    as_row = lambda a: torch.as_tensor(a, dtype=torch.long, device=dev).view(1, -1)  # noqa: E731
    out, index, accepted = ops.tree_speculative_sampling(as_row(tree.tokens), as_row(first), as_row(nxt), p[None],
                                                         generator=source.generator)
    a = int(accepted[0])
    return out[0, :a + 1].tolist(), index[0, 1:a + 1].tolist()
