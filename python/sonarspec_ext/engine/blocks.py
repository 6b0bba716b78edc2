"""Batch building: a step's sequences packed into the target's input, one ``Block`` per
sequence as ``pack`` lays it out and the step strategies (``generic_step``,
``single_token_step``) read it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from ..runtime.metadata import TreeBlock
from ..runtime.transfer import to_device
from ..spec.proposer import Draft


@dataclass(frozen=True)
class Block:
    seq: object                # engine.sequence.Sequence
    start: int                 # position of the step's first token
    row: int                   # the block's first row in the packed input
    num_tokens: int            # the step's tokens of the sequence (a prefill chunk, or its last token)
    at_end: bool               # they reach the sequence's last token: its next tokens are sampled
    logits_offset: int         # the block's first row among the step's logits (at_end blocks)
    draft: Optional[Draft]     # drafts packed after the tokens, or None

    @property
    def num_logits(self) -> int:
        """Rows of logits the block has: its last token's and one per draft token."""
        return 1 + (len(self.draft.token_ids) if self.draft is not None else 0)


def pack(engine, batch, drafts):
    """The target's packed input for a step of ``engine``: prefill chunks, and for decoding
    sequences their last token plus drafts. Returns (input_ids, positions, metadata,
    blocks, logits_indices) with one ``Block`` per sequence."""
    input_ids: List[int] = []
    starts, lens, logits_idx, blocks, trees = [], [], [], [], []
    for seq, start, n in batch:
        toks = seq.all_ids[start:start + n]
        draft = drafts.get(seq.seq_id)
        tree = None if draft is None else draft.tree
        if draft is not None:
            toks = toks + draft.token_ids
        # a tree's root (the last token) and nodes sit in tree order from ``start``
        trees.append(None if tree is None else TreeBlock(start, tree.ancestor_bits(), start + tree.depths))
        row = len(input_ids)
        input_ids.extend(toks)
        starts.append(start)
        lens.append(len(toks))
        at_end = start + n == seq.num_tokens   # the step reaches the sequence's last token
        blocks.append(Block(seq, start, row, n, at_end, len(logits_idx), draft))
        if at_end:
            logits_idx.extend(range(row + n - 1, len(input_ids)))
    meta, positions = engine.runner.planner_metadata(engine.planner, [s.seq_id for s, *_ in batch], starts, lens,
                                                     engine.model_config.sliding_window, trees)
    ids, logits_idx = to_device([np.asarray(input_ids, dtype=np.int64), np.asarray(logits_idx, dtype=np.int64)],
                                engine.device)
    return ids, positions, meta, blocks, logits_idx
