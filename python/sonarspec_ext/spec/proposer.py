"""Draft proposers: what fills the lookahead slots of a decode step.

A proposer is asked for up to ``k`` draft tokens per decoding sequence; the engine's
target pass verifies them. ``NoProposer`` is plain decoding (k = 0 for everyone). How
model drafters build their chains is in ``spec.chains``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch


@dataclass
class Draft:
    """Draft tokens for one sequence and the distributions they were drawn from.

    ``probs`` is (len(token_ids), vocab_size), or None for point-mass drafts (greedy or
    lookup drafting), which verification treats as one-hot rows. ``tree`` (a
    ``spec.tree.DraftTree``) makes the tokens a tree's nodes instead of a chain. ``lookup``:
    the tokens come from the context (prompt lookup), not from a model drafter's chain -
    which therefore wrote no KV for them."""
    token_ids: List[int]
    probs: Optional[torch.Tensor] = None
    tree: Optional[object] = None
    lookup: bool = False

    @property
    def depth(self) -> int:
        """Draft positions beyond the last token: the chain's length or the tree's depth."""
        return len(self.token_ids) if self.tree is None else int(self.tree.depths.max())


@dataclass
class StepRecord:
    """What one engine step did for one live sequence, handed to ``Proposer.after_step``.

    The target computed positions ``start`` onwards; ``hidden`` holds its final hidden
    states for the positions that are now valid (a prefill chunk, or the sequence's last
    token plus the accepted drafts), when the proposer asked for them."""
    seq: object
    start: int
    n_before: int                 # seq.num_tokens before the step
    draft: Optional[Draft]
    num_accepted: int
    at_end: bool                  # the step reached the sequence's last token and emitted tokens
    hidden: Optional[torch.Tensor] = None

    @property
    def decoded(self) -> bool:
        """A plain decode step: one token in, one token out, no drafts."""
        return self.at_end and self.draft is None and self.start == self.n_before - 1


@dataclass
class StepContext:
    """What the engine tells a proposer about the step it hands to ``after_step``."""
    #: the step ran without speculation (under load): the proposer may defer the work that
    #: follows its decoded tokens and prefilled chunks and catch up once speculation resumes
    paused: bool = False
    #: page tables captured by the engine while the next step is planned on the planner's
    #: thread (which may grow or release pages meanwhile); None: ask the planner
    tables: Optional[dict] = None


class Proposer:
    #: extra KV slots each decoding sequence needs beyond its next token
    lookahead: int = 0
    max_draft_tokens: int = 0
    #: whether ``after_step`` needs the target's final hidden states
    needs_hidden: bool = False
    #: whether all-decode steps with one draft each may run the single-token MTP schedule
    single_token_schedule: bool = False
    planner = None
    #: drafters that run a model (draft LLM, MTP head): its runner, the vocabulary its drafts
    #: come from, and whether sampled requests draw their drafts from it (``propose_chains``)
    runner = None
    vocab_size: int = 0
    sample_drafts: bool = False
    #: the context of the ``after_step`` call in progress (None outside it)
    step: Optional[StepContext] = None

    def page_table(self, seq) -> List[int]:
        """The page table of ``seq`` this step's work must use."""
        tables = self.step.tables if self.step is not None else None
        if tables is not None and seq.seq_id in tables:
            return tables[seq.seq_id]
        return self.planner.page_table(seq.seq_id)

    def ready(self, seq) -> bool:
        """Whether ``seq`` can be drafted for in this step."""
        return True

    def backlog(self, seq) -> int:
        """Positions of ``seq`` the drafter must run before its next draft (a re-run left
        waiting: after a step, one more than the drafts it kept; after a prefill or paused
        steps, all of their tokens)."""
        return 0

    def propose(self, seqs: Sequence, ks: Sequence[int]) -> List[Draft]:
        return [Draft([]) for _ in seqs]

    def finish_step(self, records: Sequence[StepRecord], ctx: StepContext) -> None:
        """The engine's call after a step: ``after_step`` with ``ctx`` in force."""
        self.step = ctx
        try:
            self.after_step(records)
        finally:
            self.step = None

    def after_step(self, records: Sequence[StepRecord]) -> None:
        """Called with a record for every live sequence the step computed (``self.step`` is
        its context)."""

    def reset(self, seq) -> None:
        """``seq`` lost its KV (preempted) or finished."""

    def kv_valid(self, seq) -> int:
        """Positions of ``seq`` below it hold valid KV in the proposer's own pool (a drafter
        model's; proposers without one: no limit)."""
        return 1 << 62

    def adopt_prefix(self, seq, num_tokens: int) -> None:
        """``seq`` was admitted with the KV of its first ``num_tokens`` positions found in the
        prefix cache, in every model's pool: the proposer's too."""


class NoProposer(Proposer):
    pass


@dataclass
class RefillRow:
    """A drafter run over one sequence's tokens (after a step, or one chain step), run at
    once or left waiting until the sequence's next draft."""
    seq: object
    start: int                               # position of the first token
    tokens: List[int]
    features: Optional[torch.Tensor] = None  # MTP heads: the target's hidden states, one per token
    at_end: bool = True                      # ends at the sequence's last token: its output drafts next

    @property
    def end(self) -> int:
        """The position after the row's last token."""
        return self.start + len(self.tokens)


def waiting_rows(waiting: dict, seqs: Sequence, ks: Sequence[int]) -> Optional[Tuple[int, list]]:
    """(k, each sequence's waiting refill row) when every sequence in ``seqs`` has a refill
    waiting in ``waiting`` (seq_id -> row) and all take the same k >= 1; else None."""
    k = ks[0] if ks else 0
    rows = [waiting.get(s.seq_id) for s in seqs]
    if k < 1 or any(x != k for x in ks) or any(r is None for r in rows):
        return None
    return k, rows


def flush_waiting(waiting: dict, refill: Callable) -> None:
    """Runs ``refill`` over the refills still waiting (no step drafted for them since)."""
    if waiting:
        rows = list(waiting.values())
        waiting.clear()
        refill(rows)
