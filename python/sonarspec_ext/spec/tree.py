"""Draft trees: the encoding verification needs, and EAGLE-2 / static tree selection.

Node 0 is the root - the sequence's last token, already emitted - and nodes 1.. are
drafts, parents before children. The target sees the root and the nodes in index order
at positions ``start + index`` of its KV (tree-ordered slots), with RoPE positions
``start + depth``; an accepted path is moved into place afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..runtime.metadata import TREE_MAX_NODES, tree_bits


@dataclass
class DraftTree:
    tokens: List[int]     # tokens[0] is the root's token
    parents: List[int]    # parents[0] == -1, parents[i] < i

    def __post_init__(self):
        n = len(self.tokens)
        if n != len(self.parents) or n < 1 or self.parents[0] != -1:
            raise ValueError("a draft tree needs one parent per token and a root (parent -1) at index 0")
        if n > TREE_MAX_NODES:
            raise ValueError(f"a draft tree holds at most {TREE_MAX_NODES} tokens with its root, got {n}")
        if any(not 0 <= p < i for i, p in enumerate(self.parents) if i):
            raise ValueError("draft tree parents must come before their children (0 <= parent < index)")

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def depths(self) -> np.ndarray:
        d = np.zeros(len(self), dtype=np.int64)
        for i in range(1, len(self)):
            d[i] = d[self.parents[i]] + 1
        return d

    def links(self) -> Tuple[np.ndarray, np.ndarray]:
        """(first_child, next_sibling), -1 where there is none; siblings in index order."""
        n = len(self)
        first, nxt = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        for i in range(n - 1, 0, -1):
            p = self.parents[i]
            nxt[i], first[p] = first[p], i
        return first, nxt

    def ancestor_mask(self) -> np.ndarray:
        """(n, n) bool: node i sees node j when j is i or one of its ancestors."""
        m = np.eye(len(self), dtype=bool)
        for i in range(1, len(self)):
            m[i] |= m[self.parents[i]]
        return m

    def ancestor_bits(self) -> np.ndarray:
        return tree_bits(self.ancestor_mask())


@dataclass
class _Node:
    token: int
    parent: int          # index into the candidate list, -1 for children of the root
    depth: int
    score: float         # cumulative draft log-probability of the path
    ranks: Tuple[int, ...] = ()
    slot: int = -1       # head KV slot within the drafting tree block once expanded
    bits: int = 0        # head-slot ancestor bits (itself included) once expanded
    feature: Optional[object] = field(default=None, repr=False)


class TreeBuilder:
    """Grows one sequence's candidate tree depth by depth and selects the final tree.

    Dynamic (EAGLE-2): each expanded node proposes its ``top_k`` most likely children;
    the ``top_k`` best candidates of a depth (by cumulative log-probability) are expanded
    next; the final tree keeps the ``num_nodes`` best candidates overall, which is always
    a connected tree because a child never scores above its parent. Static: ``paths``
    (EAGLE-1 style lists of child ranks) fix which ranks are proposed and expanded."""

    def __init__(self, root_token: int, top_k: int, num_nodes: int, depth: int,
                 paths: Optional[Sequence[Tuple[int, ...]]] = None):
        self.root_token, self.top_k, self.num_nodes, self.depth = root_token, top_k, num_nodes, depth
        self.paths = None if paths is None else {tuple(p) for p in paths if len(p) <= depth}
        self.nodes: List[_Node] = []
        self.num_expanded = 0

    def _child_ranks(self, ranks: Tuple[int, ...]) -> List[int]:
        if self.paths is None:
            return list(range(self.top_k))
        return sorted(p[-1] for p in self.paths if len(p) == len(ranks) + 1 and p[:-1] == ranks)

    def add_children(self, parent: int, logprobs: np.ndarray, top: np.ndarray) -> None:
        """Children of candidate ``parent`` (-1: the root) from its draft distribution:
        ``top`` are token ids by decreasing ``logprobs``."""
        base = self.nodes[parent] if parent >= 0 else None
        depth, score, ranks = (1, 0.0, ()) if base is None else (base.depth + 1, base.score, base.ranks)
        if depth > self.depth:
            return
        for r in self._child_ranks(ranks):
            if r < len(top) and np.isfinite(logprobs[r]):
                self.nodes.append(_Node(int(top[r]), parent, depth, score + float(logprobs[r]), ranks + (r,)))

    def to_expand(self, depth: int) -> List[int]:
        """Candidates of ``depth`` whose children are drafted next (assigns their head slots)."""
        if depth >= self.depth:
            return []
        at = [i for i, n in enumerate(self.nodes) if n.depth == depth]
        if self.paths is None:
            at = sorted(sorted(at, key=lambda i: -self.nodes[i].score)[:self.top_k])
        else:
            at = [i for i in at if self._child_ranks(self.nodes[i].ranks)]
        at = at[:max(0, TREE_MAX_NODES - self.num_expanded)]
        for i in at:
            node = self.nodes[i]
            node.slot = self.num_expanded
            node.bits = (self.nodes[node.parent].bits if node.parent >= 0 else 0) | (1 << node.slot)
            self.num_expanded += 1
        return at

    def finish(self) -> DraftTree:
        """The selected tree: the best ``num_nodes`` candidates, kept in creation order (so
        parents precede children)."""
        keep = sorted(range(len(self.nodes)), key=lambda i: (-self.nodes[i].score, i))[:self.num_nodes]
        keep = sorted(keep)
        index = {c: j + 1 for j, c in enumerate(keep)}
        tokens, parents = [self.root_token], [-1]
        for c in keep:
            node = self.nodes[c]
            tokens.append(node.token)
            parents.append(0 if node.parent < 0 else index[node.parent])
        return DraftTree(tokens, parents)


def max_expanded(top_k: int, depth: int, paths: Optional[Sequence[Sequence[int]]]) -> int:
    """Head KV slots a drafting tree block can use (nodes that get expanded)."""
    if paths is None:
        return min(TREE_MAX_NODES, top_k * max(0, depth - 1))
    prefixes = {tuple(p[:-1]) for p in paths if 1 < len(p) <= depth}
    return min(TREE_MAX_NODES, len(prefixes))
