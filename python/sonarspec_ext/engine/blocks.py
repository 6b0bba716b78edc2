"""``Block``: one sequence's part of a packed target step, as ``Engine.pack`` lays it out
and the step strategies (``generic_step``, ``sync_free_step``) read it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

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
