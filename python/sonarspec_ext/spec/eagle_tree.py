"""EAGLE tree speculation: the MTP head drafts a tree, the target verifies it in one pass.

Drafting runs the head once per depth over the nodes chosen for expansion, all sequences
together. Expanded nodes get head KV slots in a tree block after the head's committed
prefix and attend to that prefix plus their own ancestors (``TreeBlock``), at RoPE
position ``N - 2 + depth``. After verification the head is re-run over the accepted path
with the target's hidden states exactly as for chains (``MTPProposer.after_step``), which
overwrites the tree block.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch

from ..ops.limits import NATIVE_ATTENTION_MAX_TOKENS
from ..runtime.metadata import TreeBlock
from ..sampling.penalties import penalize_draft_logits
from .mtp import MTPProposer
from .proposer import Draft
from .tree import TreeBuilder, max_expanded


class EagleTreeProposer(MTPProposer):
    def __init__(self, head, depth: int, top_k: int, num_nodes: int, planner, num_pages: int, page_size: int,
                 dtype, device, paths: Optional[List[List[int]]] = None,
                 token_budget: int = NATIVE_ATTENTION_MAX_TOKENS):
        super().__init__(head, depth, planner, num_pages, page_size, dtype, device)
        self.single_token_schedule = False   # trees never take the single-token schedule
        self.defer_refills = False   # trees draft from the carried state, so the head re-runs at once
        self.top_k, self.num_nodes = top_k, (len(paths) if paths is not None else num_nodes)
        self.paths = None if paths is None else [tuple(p) for p in paths]
        self.token_budget = token_budget
        self.lookahead = max(self.num_nodes, max_expanded(top_k, depth, self.paths))

    def nodes_for_batch(self, batch_size: int) -> int:
        """Tree size per sequence: the whole verification step stays within ``token_budget``
        query tokens (root included), so larger batches draft smaller trees."""
        return max(1, min(self.num_nodes, self.token_budget // max(1, batch_size) - 1))

    def propose(self, seqs: Sequence, ks: Sequence[int]) -> List[Draft]:
        if not seqs:
            return []
        nodes = self.nodes_for_batch(len(seqs))
        states = [self.state[s.seq_id] for s in seqs]
        # a tree's candidates take up to ``lookahead`` KV slots past the sequence: in the last
        # slots of the context (the planner reserves none past it) the sequence decodes plainly
        fits = [self.planner.max_model_len - s.num_tokens >= self.lookahead for s in seqs]
        caps = [nodes if s.params.max_draft_tokens is None else min(nodes, s.params.max_draft_tokens) for s in seqs]
        builders = [TreeBuilder(s.all_ids[-1], self.top_k, n, min(k, n) if ok else 0, self.paths)
                    for s, k, n, ok in zip(seqs, ks, caps, fits)]
        first = torch.stack([self.carried_logits(st.logits) for st in states])
        self._add_children(builders, [[-1] for _ in seqs], first, seqs)
        for depth in range(1, max(b.depth for b in builders)):
            expand = [b.to_expand(depth) for b in builders]
            if not any(expand):
                break
            rows, trees, feats = [], [], []
            for s, st, b, ex in zip(seqs, states, builders, expand):
                if not ex:
                    continue
                begin = s.num_tokens - 1            # head prefix: positions < N - 1 are accurate
                rows.append((begin + b.nodes[ex[0]].slot, [b.nodes[i].token for i in ex],
                             self.page_table(s)))
                trees.append(TreeBlock(begin, np.array([b.nodes[i].bits for i in ex], dtype=np.uint64).view(np.int64),
                                       np.full(len(ex), begin - 1 + depth, dtype=np.int64)))
                feats.extend(st.feature if b.nodes[i].parent < 0 else b.nodes[b.nodes[i].parent].feature for i in ex)
            logits, out = self.runner.forward_rows(rows, self.head.config.sliding_window, features=torch.stack(feats),
                                                   trees=trees, all_tokens=True)
            r = 0
            for b, ex in zip(builders, expand):
                for i in ex:
                    b.nodes[i].feature = out[r]
                    r += 1
            self._add_children([b for b, ex in zip(builders, expand) if ex], [ex for ex in expand if ex], logits,
                               [s for s, ex in zip(seqs, expand) if ex])
        drafts = []
        for b in builders:
            tree = b.finish()
            drafts.append(Draft(tree.tokens[1:], tree=tree))
        return drafts

    def _add_children(self, builders, parents, logits: torch.Tensor, seqs: Sequence) -> None:
        """Adds the top-k children of each parent (one logits row per parent, in order; the
        rows of a request with penalties or a logit bias changed as a drafter's are)."""
        owners = [s for s, ps in zip(seqs, parents) for _ in ps]
        if any(s.params.penalized for s in owners):
            logits = torch.stack([penalize_draft_logits(row, s) for row, s in zip(logits, owners)])
        logprobs = torch.log_softmax(logits.float(), -1)
        k = self.top_k if self.paths is None else 1 + max(p[-1] for p in self.paths)
        top_lp, top_ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
        top_lp, top_ids = top_lp.cpu().numpy(), top_ids.cpu().numpy()
        r = 0
        for b, ps in zip(builders, parents):
            for p in ps:
                b.add_children(p, top_lp[r], top_ids[r])
                r += 1
