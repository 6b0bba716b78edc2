"""A replay drafter: speculation at a controlled acceptance rate, whatever the draft model.

``ReplayProposer`` knows each prompt's greedy continuation under the target (from a plain
decoding run) and proposes it, each draft token kept with probability ``acceptance``
independently, else replaced by a wrong token. Verification then accepts position i of
a chain with probability acceptance^i, so the tokens per step tau = sum_i acceptance^i
follows from the rate, and the engine's speedup over plain decoding at that tau measures
its own speculation efficiency - the cost of verifying 1 + K tokens, of the step's host
work - independent of any drafter's quality or cost (it runs no model).

Trees (``tree_width`` > 1): at each depth ``tree_width`` siblings under the current path
node; with probability ``acceptance`` one of them (at random) holds the reference token
and the path continues below it, else all are wrong and the path continues below the
first. The same per-depth acceptance as a chain, at 1 + depth x width verified nodes:
the cost of verifying a tree of that size.

For benchmarks and tests of greedy requests only (the drafts are point masses).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from ..spec.proposer import Draft, Proposer
from ..spec.tree import DraftTree


class ReplayProposer(Proposer):
    def __init__(self, references: Dict[tuple, List[int]], acceptance: float, num_draft_tokens: int,
                 vocab_size: int, tree_width: int = 1, seed: int = 0):
        """``references``: prompt token ids (tuple) -> the target's greedy output tokens;
        ``num_draft_tokens``: the chain's length, or the tree's depth."""
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
        if num_draft_tokens < 1 or tree_width < 1:
            raise ValueError("num_draft_tokens and tree_width must be at least 1")
        self.references, self.acceptance, self.width = references, acceptance, tree_width
        self.vocab = vocab_size
        self.max_draft_tokens = num_draft_tokens
        self.lookahead = num_draft_tokens * tree_width
        self.rng = np.random.default_rng(seed)

    def _wrong(self, token: int) -> int:
        return (token + 1 + int(self.rng.integers(0, self.vocab - 1))) % self.vocab

    def propose(self, seqs: Sequence, ks: Sequence[int]) -> List[Draft]:
        drafts = []
        for s, k in zip(seqs, ks):
            ref = self.references.get(tuple(s.prompt_ids))
            n = len(s.all_ids) - len(s.prompt_ids)   # output tokens so far: the next is ref[n]
            k = min(k, len(ref) - n) if ref is not None else 0
            if k <= 0:
                drafts.append(Draft([]))
            elif self.width == 1:
                drafts.append(Draft([t if self.rng.random() < self.acceptance else self._wrong(t)
                                     for t in ref[n:n + k]]))
            else:
                drafts.append(self._tree(s.all_ids[-1], ref[n:n + k]))
        return drafts

    def _tree(self, root: int, path: List[int]) -> Draft:
        tokens, parents, node = [root], [-1], 0
        for t in path:
            hit = int(self.rng.integers(0, self.width)) if self.rng.random() < self.acceptance else -1
            first = len(tokens)
            for j in range(self.width):
                tokens.append(t if j == hit else self._wrong(t))
                parents.append(node)
            node = first + max(hit, 0)
        tree = DraftTree(tokens, parents)
        return Draft(tree.tokens[1:], tree=tree)


def expected_tau(acceptance: float, k: int) -> float:
    """Tokens per step of a chain of k drafts each kept with probability ``acceptance``."""
    return float(sum(acceptance ** i for i in range(k + 1)))
