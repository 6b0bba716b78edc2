"""Torch reference implementations of the native ops: the tests' oracles."""
import torch

from ..ops.sampling import filter_logits, processed_probs_reference  # noqa: F401 (oracles too)
from ..sampling.sampler import inverse_cdf


def kv_store_reference(k_pool: torch.Tensor, v_pool: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       slot_mapping: torch.Tensor) -> None:
    """pool[slot_mapping[i]] = src[i] for every token i with a valid slot."""
    valid = (slot_mapping >= 0) & (slot_mapping < k_pool.shape[0])
    k_pool[slot_mapping[valid]] = k[valid].to(k_pool.dtype)
    v_pool[slot_mapping[valid]] = v[valid].to(v_pool.dtype)


def _sample_row(probs: torch.Tensor, generator) -> int:
    """One draw from an (unnormalised, non-negative) row via the exponential race."""
    e = torch.empty_like(probs, dtype=torch.float64).exponential_(generator=generator)
    return int((probs.double() / e).argmax())


def chain_speculative_sampling_reference(draft_probs, draft_token_ids, target_probs, uniforms):
    """Chain rejection sampling, FlashInfer semantics (see ops.chain_speculative_sampling),
    with the randomness given: ``uniforms`` (B, K + 1) float64; ``draft_probs`` None means
    point-mass drafts."""
    B, K = draft_token_ids.shape
    V = target_probs.shape[-1]
    out = torch.full((B, K + 1), -1, dtype=torch.int32)
    accepted = torch.zeros(B, dtype=torch.int32)
    emitted = torch.zeros(B, dtype=torch.int32)
    for b in range(B):
        ids = draft_token_ids[b].long()
        q = (draft_probs[b] if draft_probs is not None else torch.nn.functional.one_hot(ids, V)).double()
        p = target_probs[b].double()
        ok = uniforms[b, :K] * q[torch.arange(K), ids] < p[torch.arange(K), ids]
        accepted[b] = int(ok.sum())
        stop = int(ok.long().cumprod(0).sum())
        out[b, :stop] = ids[:stop].int()
        residual = p[stop] if stop == K else (p[stop] - q[stop]).clamp_min(0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: the residual is undefined
            residual = p[stop]
        out[b, stop] = int(inverse_cdf(residual, uniforms[b, K]))
        emitted[b] = stop
    return out, accepted, emitted


def shifted_scatter_reference(input_ids, block_starts, block_lens, next_tokens, accepted):
    """Torch reference of ops.shifted_scatter."""
    out = input_ids.clone()
    for s, n, t, a in zip(block_starts.tolist(), block_lens.tolist(), next_tokens.tolist(), accepted.tolist()):
        if n < 1 or not 0 <= a < n:
            continue
        out[s:s + n - 1] = input_ids[s + 1:s + n]
        out[s + n - 1] = t
        out[s + a] = t
    return out


def paged_attention_reference(q, k_pool, v_pool, kv_slots, token_seq, key_begin, key_end, scale):
    """Torch reference of ops.paged_attention (float64 softmax, one token at a time)."""
    T, H, D = q.shape
    group = H // k_pool.shape[1]
    out = torch.zeros(T, H, D, dtype=torch.float64)
    for t in range(T):
        lo, hi = max(0, int(key_begin[t])), min(int(key_end[t]), kv_slots.shape[1])
        if lo >= hi:
            continue
        slots = kv_slots[int(token_seq[t]), lo:hi]
        k = k_pool[slots].double().repeat_interleave(group, dim=1)   # (n, H, D)
        v = v_pool[slots].double().repeat_interleave(group, dim=1)
        w = torch.einsum("hd,nhd->hn", q[t].double(), k).mul(scale).softmax(-1)
        out[t] = torch.einsum("hn,nhd->hd", w, v)
    return out.reshape(T, H * D).float()


def attention_with_lse(q, k, v, mask, scale):
    """Masked attention of q (T, H, D) over k, v (T, N, H, D) per query -> (out (T, H, D),
    lse (T, H)) in float64; ``mask`` (T, N) bool. Rows with no visible key give lse -inf."""
    s = torch.einsum("thd,tnhd->thn", q.double(), k.double()) * scale
    s = s.masked_fill(~mask[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, -1)
    w = torch.exp(s - lse.nan_to_num(neginf=0.0)[..., None]).nan_to_num(0.0)
    return torch.einsum("thn,tnhd->thd", w, v.double()), lse


def merge_state(out_a, lse_a, out_b, lse_b):
    """Merges two partial attention states over disjoint key sets by log-sum-exp."""
    lse = torch.logaddexp(lse_a, lse_b)
    wa = torch.exp(lse_a - lse).nan_to_num(0.0)[..., None]
    wb = torch.exp(lse_b - lse).nan_to_num(0.0)[..., None]
    return wa * out_a + wb * out_b, lse


def tree_attention_cascade_reference(q, k_pool, v_pool, kv_slots, token_seq, key_begin, key_end, tree_begin,
                                     tree_mask, scale):
    """ops.paged_attention with tree masks as a two-level cascade: each query's prefix
    [key_begin, key_end) and its tree ancestors attended separately, merged by ``merge_state``."""
    T, H, D = q.shape
    group = H // k_pool.shape[1]
    L = kv_slots.shape[1]
    keys = torch.arange(L)
    rows = kv_slots[token_seq]                                             # (T, L)
    k = k_pool[rows].repeat_interleave(group, dim=2)                       # (T, L, H, D)
    v = v_pool[rows].repeat_interleave(group, dim=2)
    prefix = (keys >= key_begin[:, None]) & (keys < key_end[:, None])
    rel = keys[None, :] - tree_begin[:, None]
    bits = (tree_mask[:, None] >> rel.clamp(0, 63)) & 1
    tree = (rel >= 0) & (rel < 64) & (bits == 1)
    out, lse = merge_state(*attention_with_lse(q, k, v, prefix, scale), *attention_with_lse(q, k, v, tree, scale))
    return out.reshape(T, H * D).float()


def tree_walk(candidates, first_child, next_sibling, target_probs, draft_probs, uniforms):
    """One tree of ``tree_speculative_sampling_reference``: (emitted tokens, accepted
    nodes). The t-th child tried uses uniforms[t]; the final draw uniforms[-1]."""
    tokens, path, node, tries = [], [], 0, 0
    while True:
        p = target_probs[node].double()
        p = p / p.sum()
        q = None if draft_probs is None else draft_probs[node].double()
        child, moved = int(first_child[node]), False
        while child != -1:
            x = int(candidates[child])
            u = float(uniforms[tries])
            tries += 1
            if u * (1.0 if q is None else float(q[x])) < float(p[x]):
                tokens.append(x)
                path.append(child)
                node, moved = child, True
                break
            # rejected: remove the candidate's mass (point mass) or q's mass (sampled draft)
            rest = p.clone()
            if q is None:
                rest[x] = 0
            else:
                rest = (rest - q).clamp_min(0)
            if float(rest.sum()) > 0:   # p == q up to rounding leaves nothing: keep p
                p = rest / rest.sum()
            child = int(next_sibling[child])
        if not moved:
            tokens.append(int(inverse_cdf(p, uniforms[-1])))
            return tokens, path


def tree_speculative_sampling_reference(candidates, first_child, next_sibling, target_probs, draft_probs, uniforms):
    """Recursive rejection sampling over draft trees (see ops.tree_speculative_sampling),
    ``uniforms`` (B, N + 1) float64."""
    B, N = candidates.shape
    out = torch.full((B, N), -1, dtype=torch.int64)
    accept_index = torch.full((B, N), -1, dtype=torch.int64)
    num_accepted = torch.zeros(B, dtype=torch.int64)
    for b in range(B):
        tokens, path = tree_walk(candidates[b], first_child[b], next_sibling[b], target_probs[b],
                                 None if draft_probs is None else draft_probs[b], uniforms[b])
        out[b, :len(tokens)] = torch.tensor(tokens)
        accept_index[b, :len(path) + 1] = torch.tensor([0] + path)
        num_accepted[b] = len(path)
    return out, accept_index, num_accepted
