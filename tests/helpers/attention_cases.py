"""Random paged-attention cases and their dense-mask oracle, shared by the CPU and CUDA
kernel tests."""
import numpy as np
import torch


def pages(B, max_kv, page_size, g, spare=3):
    """Random block tables over a shared pool, and the per-position slots they imply."""
    max_pages = -(-max_kv // page_size)
    pool = torch.randperm(B * max_pages + spare, generator=g)
    table = pool[:B * max_pages].view(B, max_pages)
    pos = torch.arange(max_kv)
    return table, table[:, pos // page_size] * page_size + pos % page_size, (B * max_pages + spare) * page_size


def full_mask_attention(q, k_pool, v_pool, kv_slots, token_seq, mask, scale):
    """The oracle: one softmax per query over every visible key of a dense (T, max_kv) mask."""
    T, H, D = q.shape
    k = k_pool[kv_slots[token_seq]].double().repeat_interleave(H // k_pool.shape[1], dim=2)
    v = v_pool[kv_slots[token_seq]].double().repeat_interleave(H // k_pool.shape[1], dim=2)
    s = torch.einsum("thd,tnhd->thn", q.double(), k).mul(scale).masked_fill(~mask[:, None, :], float("-inf"))
    return torch.einsum("thn,tnhd->thd", s.softmax(-1), v).reshape(T, H * D).float()


def random_tree_ancestors(nodes, g):
    """anc[i, j]: node j is node i or one of its ancestors, in a random tree (parents first)."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, nodes)]
    anc = np.zeros((nodes, nodes), dtype=bool)
    for i in range(nodes):
        j = i
        while j >= 0:
            anc[i, j], j = True, parents[j]
    return anc
