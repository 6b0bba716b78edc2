"""Draft chains of model drafters (MTP heads, draft models): tokens drawn step by step
from the drafter's logits (``propose_chains``), or whole chains in one native call on the
CPU (``native_chains``) or on the device (``device_chains``) where the batch allows
(``fused_chains``); the sampled requests' uniforms and penalties for those calls."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..sampling.penalties import factor_rows, penalize_draft_logits, token_counts
from ..sampling.sampler import draw, processed_probs, top_tokens
from ..ops.stack_drafting import block_table, chain, fits
from .device_chain import chain_length, device_chains
from .draft_stop import kept_length, token_probability
from .proposer import Draft


def draw_draft(seq, logits: torch.Tensor, sample_drafts: bool, offset: int) -> Tuple[int, Optional[torch.Tensor]]:
    """Draft ``offset`` (0: the next output token) from (vocab_size,) logits: the top token,
    or with ``sample_drafts`` a draw from the request's processed distribution q (returned
    with it) at the request's uniform for that output position (``Request.uniforms``)."""
    if seq.params.greedy or not sample_drafts:
        return top_tokens(logits)[0], None
    q = processed_probs(logits.unsqueeze(0), seq.params)
    return draw(q, seq.uniforms(offset, 1))[0], q[0]


def _add_draft_token(draft: Draft, tok: int, q: Optional[torch.Tensor]) -> None:
    draft.token_ids.append(tok)
    if draft.probs is not None:   # drafts drawn from q (greedy requests keep point masses: probs None)
        draft.probs.append(q)


def propose_chains(seqs: Sequence, ks: Sequence[int], logits: List[torch.Tensor], sample_drafts: bool,
                   advance: Callable, stop_below: float = 0.0) -> List[Draft]:
    """Chain drafting shared by draft models and MTP heads: draft j + 1 of sequence i is
    drawn from ``logits[i]``; ``advance(j, rows, drafts)`` runs the drafter once for the
    sequences ``rows`` that need another token and returns their next logits. With
    ``stop_below`` a point-mass chain ends where its probability falls below it
    (``spec.draft_stop``)."""
    drafts = [Draft([], [] if sample_drafts and not s.params.greedy else None) for s in seqs]
    logits, ks = [penalize_draft_logits(lg, s) for s, lg in zip(seqs, logits)], list(ks)
    likely = [1.0] * len(seqs)   # each draft's probability so far
    for j in range(max(ks, default=0)):
        for i, s in enumerate(seqs):
            if ks[i] > j:
                tok, q = draw_draft(s, logits[i], sample_drafts, j)
                if stop_below > 0 and q is None:
                    likely[i] *= token_probability(logits[i], tok)
                    if j > 0 and likely[i] < stop_below:
                        ks[i] = j   # this chain ends before the token
                        continue
                _add_draft_token(drafts[i], tok, q)
        rows = [i for i in range(len(seqs)) if ks[i] > j + 1]
        if rows:
            for i, lg in zip(rows, advance(j, rows, drafts)):
                logits[i] = penalize_draft_logits(lg, seqs[i])
    for d in drafts:
        if d.probs is not None:
            d.probs = torch.stack(d.probs) if d.probs else None
    return drafts


def fused_chains(proposer, seqs: Sequence, ks: Sequence[int], logits: List[torch.Tensor], positions: Sequence[int],
                 window: Optional[int], features: Optional[torch.Tensor] = None,
                 stop_below: float = 0.0) -> Optional[List[Draft]]:
    """All of a step's chains without a host round trip per round: ``native_chains`` (CPU
    drafters running as a native stack), else greedy ``device_chains``; None where neither
    applies (``propose_chains`` then runs the rounds one by one). ``proposer`` supplies the
    runner, page tables, draft vocabulary and sampling mode; ``positions``, ``features`` as
    for ``native_chains``; ``stop_below`` as in ``propose_chains`` (the device chains do
    not stop: where it is set they are not used)."""
    if not seqs:
        return None
    tables = [proposer.page_table(s) for s in seqs]
    drafts = native_chains(proposer.runner, seqs, ks, logits, positions, tables, window, proposer.vocab_size,
                           features, proposer.sample_drafts, stop_below)
    if drafts is not None or stop_below > 0:
        return drafts
    k = chain_length(proposer, seqs, ks)
    if not k or any(s.params.penalized for s in seqs):   # device chains take the drafter's top tokens
        return None
    chains = device_chains(proposer.runner, logits, k, positions, tables, window, proposer.vocab_size, features)
    return [Draft(c) for c in chains]


def native_chains(runner, seqs: Sequence, ks: Sequence[int], logits: List[torch.Tensor], positions: Sequence[int],
                  tables: Sequence[Sequence[int]], window: Optional[int], width: int,
                  features: Optional[torch.Tensor] = None, sample_drafts: bool = False,
                  stop_below: float = 0.0) -> Optional[List[Draft]]:
    """``propose_chains`` in one native call (``ops.stack_drafting.chain``) when every
    sequence takes the same k >= 2 and the drafter (``runner``'s model) runs as a native
    stack: draft 1 is ``draw_draft`` from ``logits[i]``, drafts 2..k come from the chain,
    whose first round runs at ``positions[i]`` with the drafter's embedding and lm_head (its
    first ``width`` logits: ``width`` is the vocabulary of the drafts, distributions
    zero-padded past the lm_head's rows). With ``sample_drafts`` the chain draws each
    request's tokens from its processed distribution with its uniforms, in
    the order the rounds would draw them (greedy requests take top tokens: point-mass
    drafts). None when it does not apply; ``propose_chains`` then runs the rounds one by
    one, with the same result. ``stop_below`` (point-mass chains only) stops them as
    ``propose_chains`` does."""
    k, B = (ks[0] if ks else 0), len(seqs)
    if k < 2 or any(x != k for x in ks) or runner.device.type != "cpu" or runner.graphs is not None:
        return None
    io = runner.model.drafting_io()
    stack = runner.stack() if io is not None else None
    if stack is None or not fits(stack, io[1], B, B):
        return None
    embed, lm_head, row_ids = io
    vocab = min(lm_head.shape[0], width)
    sample_drafts = sample_drafts and not all(s.params.greedy for s in seqs)   # else top tokens throughout
    logits = [penalize_draft_logits(lg, s) for s, lg in zip(seqs, logits)]
    first = [draw_draft(s, lg, sample_drafts, 0) for s, lg in zip(seqs, logits)]
    table = block_table(tables)
    sampling = chain_sampling(seqs, k - 1, 1) if sample_drafts else None
    packed = torch.from_numpy(np.asarray([t for t, _ in first] + list(positions), dtype=np.int64))
    stop = stop_below > 0 and not sample_drafts
    scores = torch.empty(B, k - 1, dtype=torch.float32) if stop else None
    prior = torch.tensor([token_probability(lg, t) for lg, (t, _) in zip(logits, first)],
                         dtype=torch.float32) if stop else None
    out, probs = chain(stack, embed, lm_head, vocab, packed[:B], packed[B:], table, runner.kv_cache.page_size,
                       window, k - 1, features, sampling, row_ids, scores=scores,
                       stop_below=stop_below if stop else 0.0, prior=prior,
                       penalties=draft_penalties(seqs, row_ids, vocab))
    if stop:
        return [Draft(([t] + row)[:kept_length([p0] + sc, stop_below)])
                for (t, _), row, p0, sc in zip(first, out.tolist(), prior.tolist(), scores.tolist())]
    if not sample_drafts:
        return [Draft([t] + row) for (t, _), row in zip(first, out.tolist())]
    probs = vocab_probs(probs, row_ids, width)
    return [Draft([t] + row, None if q is None else torch.cat([q[None], probs[i]]))   # greedy requests: point masses
            for i, ((t, q), row) in enumerate(zip(first, out.tolist()))]


def chain_sampling(seqs: Sequence, rounds: int, first: int) -> tuple:
    """A native chain's sampling arguments (``ops.stack_drafting.chain``): per sequence its
    temperature (0 for greedy requests: top tokens), top_k, top_p and ``rounds`` uniforms
    for its drafts ``first`` .. ``first + rounds - 1`` (``Request.uniforms``), drawn in
    round order (greedy requests draw none)."""
    uniforms = torch.zeros(len(seqs), rounds, dtype=torch.float64)
    for i, s in enumerate(seqs):
        if not s.params.greedy:   # one call: the same consecutive draws as one call per round
            uniforms[i] = s.uniforms(first, rounds)
    ps = [s.params for s in seqs]
    return (torch.tensor([0.0 if p.greedy else p.temperature for p in ps], dtype=torch.float32),
            torch.tensor([p.top_k for p in ps], dtype=torch.long),
            torch.tensor([p.top_p for p in ps], dtype=torch.float32), uniforms)


def draft_penalties(seqs: Sequence, row_ids: Optional[torch.Tensor], rows: int) -> Optional[tuple]:
    """A native chain's ``penalties`` argument (``ops.stack_drafting.chain``) for the
    first ``rows`` lm_head rows (row r is token ``row_ids[r]``, ascending, or r): each
    request's penalties as ``penalize_draft_logits`` applies them; None when no request
    has any (the rows of requests without are zeros, their flag off)."""
    if not any(s.params.penalized for s in seqs):
        return None
    tokens = None if row_ids is None else row_ids[:rows].numpy()
    factors = np.zeros((len(seqs), 3, rows), dtype=np.float32)
    for i, s in enumerate(seqs):
        if s.params.penalized:
            factors[i] = factor_rows(token_counts(s).factors(s.params), tokens, rows)
    active = torch.tensor([s.params.penalized for s in seqs], dtype=torch.uint8)
    return active, torch.from_numpy(factors)


def vocab_probs(probs: torch.Tensor, row_ids: Optional[torch.Tensor], width: int) -> torch.Tensor:
    """Distributions (batch, rounds, lm_head rows used) of a native chain as distributions
    over the first ``width`` tokens: zero-padded, or through the token of each row."""
    if row_ids is None:
        return torch.nn.functional.pad(probs, (0, width - probs.shape[-1]))
    b, k, rows = probs.shape
    flat = probs.reshape(b * k, rows)   # scatter_ along rows: half the time of index_copy_ on dim 2
    return flat.new_zeros(b * k, width).scatter_(1, row_ids[:rows].expand(b * k, rows), flat).view(b, k, width)
