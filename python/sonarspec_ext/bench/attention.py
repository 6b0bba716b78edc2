"""Verification attention: a draft tree versus a chain with the same number of query tokens.

Both run the engine's attention path for one layer of the target (native kernel on the
CPU) over a committed prefix: the chain with causal key ranges, the tree with its prefix
plus per-query ancestor bits (cascade), and - for reference - the tree as a full mask
over the whole sequence through SDPA, the approach that costs trees their speed elsewhere.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np
import torch

from . import median_us
from ..runtime.kv_cache import KVCache
from ..runtime.metadata import TreeBlock, build_metadata
from ..layers.attention import TorchPagedAttention
from ..models.config import ModelConfig
from ..spec.tree import DraftTree


def _bushy_tree(num_tokens: int, top_k: int) -> DraftTree:
    """A tree of ``num_tokens`` (root included) where each node has up to ``top_k`` children,
    filled breadth first - the shape dynamic trees take."""
    parents = [-1] + [(i - 1) // top_k for i in range(1, num_tokens)]
    return DraftTree(list(range(num_tokens)), parents)


def bench_tree_attention(cfg: ModelConfig, contexts: Sequence[int] = (128, 512), tokens: Sequence[int] = (8, 17, 33),
                         top_k: int = 4, repeats: int = 200, page_size: int = 16) -> List[dict]:
    """Median microseconds of one layer's attention for chain, tree (cascade) and tree
    (full mask) steps of equal query count; float32 on the CPU."""
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rows = []
    g = torch.Generator().manual_seed(0)
    for ctx in contexts:
        pages = (ctx + max(tokens) + page_size) // page_size + 1
        cache = KVCache(cfg, pages, page_size, torch.float32, "cpu")
        cache.k.normal_(generator=g)
        cache.v.normal_(generator=g)
        table = list(range(pages))
        for T in tokens:
            q = torch.randn(T, H, D, generator=g)
            k, v = torch.randn(T, Hkv, D, generator=g), torch.randn(T, Hkv, D, generator=g)
            tree = _bushy_tree(T, top_k)
            block = TreeBlock(ctx, tree.ancestor_bits(), ctx + tree.depths)
            metas = {
                "chain": build_metadata([(ctx, T, table)], page_size, "cpu", native_attention=True)[0],
                "tree": build_metadata([(ctx, T, table)], page_size, "cpu", trees=[block], native_attention=True)[0],
                "tree_full_mask": build_metadata([(ctx, T, table)], page_size, "cpu", trees=[block])[0],
            }
            us = {name: median_us(lambda m=m: TorchPagedAttention(cache, m).attend(0, q, k, v), max(1, repeats // 5), 3)
                  for name, m in metas.items()}
            rows.append({"context": ctx, "query_tokens": T, "tree_depth": int(np.max(tree.depths)),
                         **{f"{name}_us": round(t, 1) for name, t in us.items()},
                         "tree_vs_chain": round(us["tree"] / us["chain"], 3),
                         "full_mask_vs_chain": round(us["tree_full_mask"] / us["chain"], 3)})
    return rows


def print_attention_table(rows: List[dict]) -> None:
    print(f"{'context':>7} {'tokens':>6} {'chain us':>9} {'tree us':>8} {'full-mask us':>12} "
          f"{'tree/chain':>10} {'mask/chain':>10}")
    for r in rows:
        print(f"{r['context']:>7} {r['query_tokens']:>6} {r['chain_us']:>9.1f} {r['tree_us']:>8.1f} "
              f"{r['tree_full_mask_us']:>12.1f} {r['tree_vs_chain']:>9.2f}x {r['full_mask_vs_chain']:>9.2f}x")
