"""The general engine step: any mix of prefill chunks, plain decodes, drafted chains and
draft trees in one target pass, verified on the host, then the drafter's refill."""
from __future__ import annotations

import time
from typing import List

from ..spec.proposer import StepRecord
from .blocks import Block, pack
from ..spec.verify import joined_rows, verify_chains, verify_tree
from ..sampling.penalties import apply_penalties
from ..sampling.sampler import sample


def generic_step(engine, batch, drafts) -> List:
    """Runs the step for ``batch`` with ``drafts`` (seq_id -> Draft); returns the sequences
    that received tokens."""
    t2 = time.perf_counter()
    native = _decode_rows(engine, batch, drafts)
    tops = None   # each logits row's top token, where the native call gave them
    if native is not None:
        blocks, logits, hidden, tops = native
        hidden = hidden if engine.proposer.needs_hidden else None
    else:
        ids, positions, meta, blocks, logits_idx = pack(engine, batch, drafts)
        out = engine.runner.forward(ids, positions, meta, logits_idx,
                                    hidden_indices=slice(None) if engine.proposer.needs_hidden else None)
        logits, hidden = out if engine.proposer.needs_hidden else (out, None)
    t3 = time.perf_counter()
    raw_rows = apply_penalties(logits, blocks)   # penalized requests' raw rows, for their logprobs
    chain_blocks = [b for b in blocks if b.at_end and b.draft is not None and b.draft.tree is None]
    chain_tops = [_block_tops(tops, b) for b in chain_blocks]
    # a greedy chain whose top tokens are known needs no logits rows (slicing one costs tens
    # of microseconds after the forward has streamed the weights through the caches)
    chains = [(None if t is not None and b.seq.params.greedy else _block_logits(logits, b), b.draft, b.seq.params,
               b.seq) for b, t in zip(chain_blocks, chain_tops)]
    chain_results = iter(verify_chains(chains, chain_tops))
    plain = [j for j, b in enumerate(blocks) if b.at_end and b.draft is None]
    plain_tokens = dict(zip(plain, _sample_rows(logits, [blocks[j] for j in plain], tops)))
    results = []
    for j, b in enumerate(blocks):
        seq, end = b.seq, b.row + b.num_tokens
        tokens, accepted, used = [], 0, list(range(b.row, end))   # used: rows now valid
        rows = None   # the block's logits rows the tokens were drawn from, for their logprobs
        if b.at_end:
            if b.draft is None:
                tokens = [plain_tokens[j]]
            elif b.draft.tree is not None:
                tokens, path = verify_tree(_block_logits(logits, b), b.draft, seq.params, seq)
                accepted = len(path)
                commit_tree_path(engine, seq, path)
                used += [end - 1 + i for i in path]
                rows = [0] + list(path)   # node i's row is i; each token comes from its parent's
            else:
                tokens, accepted = next(chain_results)
                used += range(end, end + accepted)
        token_logits = None
        if seq.logprobs is not None and tokens:
            own = raw_rows.get(seq.seq_id)
            token_logits = (_block_logits(logits, b) if own is None else own)[
                rows if rows is not None else slice(0, len(tokens))]
        results.append((b, tokens, accepted, used, token_logits))
    t4 = time.perf_counter()
    records = []
    for b, tokens, accepted, used, token_logits in results:
        n_before = engine.emit(b.seq, tokens, accepted, b.draft, token_logits)
        if not b.seq.finished:
            records.append(StepRecord(b.seq, b.start, n_before, b.draft, accepted, b.at_end,
                                      None if hidden is None else _hidden_rows(hidden, used)))
    engine.plan_ahead(records)
    t5 = time.perf_counter()
    engine.proposer.finish_step(records, engine.step_context)
    t6 = time.perf_counter()
    engine.timing["post"] += t5 - t4
    engine.timing["draft"] += t6 - t5
    engine.timing["verify"] += t3 - t2
    engine.timing["sample"] += t4 - t3
    return [b.seq for b in blocks if b.at_end]


def _decode_rows(engine, batch, drafts):
    """(blocks, logits, hidden states) of a step where every sequence decodes - its last
    token, then its chain of drafts, if any - from the runner's one native call
    (``ModelRunner.decode_rows``): every token has a logits row, so the blocks' rows and
    logits rows coincide. None for other steps (prefill chunks, draft trees) and where the
    call does not apply."""
    rows, blocks, row = [], [], 0
    for seq, start, n in batch:
        draft = drafts.get(seq.seq_id)
        if n != 1 or start != seq.num_tokens - 1 or (draft is not None and draft.tree is not None):
            return None
        toks = [seq.output_ids[-1] if seq.output_ids else seq.prompt_ids[-1]] + (draft.token_ids if draft else [])
        blocks.append(Block(seq, start, row, 1, True, row, draft))
        rows.append((start, toks, engine.planner.page_table(seq.seq_id)))
        row += len(toks)
    out = engine.runner.decode_rows(rows, engine.model_config.sliding_window)
    return None if out is None else (blocks, *out)


def _sample_rows(logits, blocks, tops) -> List[int]:
    """A token for each of ``blocks`` (no drafts: one logits row each) from one ``sample``
    call over their rows - the tokens one call per block gives, each request drawing from
    its own uniforms - or, where every block is greedy and ``tops`` has its row's top
    token, those."""
    if not blocks:
        return []
    known = [_block_tops(tops, b) for b in blocks]
    if all(t is not None and b.seq.params.greedy for t, b in zip(known, blocks)):
        return [t[0] for t in known]
    return sample(joined_rows([_block_logits(logits, b) for b in blocks]), [b.seq.params for b in blocks],
                  [b.seq for b in blocks])


def _block_tops(tops, b):
    """The top tokens of block ``b``'s logits rows from the step's ``tops``, or None where
    there are none or its request's penalties or bias changed its rows since."""
    if tops is None or b.seq.params.penalized:
        return None
    return tops[b.logits_offset:b.logits_offset + b.num_logits]


def _hidden_rows(hidden, used: List[int]):
    """The hidden states of the rows ``used`` (ascending): a view where they are consecutive
    (decodes and chains; the step's hidden tensor is fresh each step), else a copy (tree
    paths) - indexing with a list copies, which costs ~10 us a sequence every step."""
    if used and used[-1] - used[0] == len(used) - 1:
        return hidden[used[0]:used[-1] + 1]
    return hidden[used]


def _block_logits(logits, b):
    return logits[b.logits_offset:b.logits_offset + b.num_logits]


def commit_tree_path(engine, seq, path: List[int]) -> None:
    """Moves the target KV of accepted tree nodes (tree-ordered slots after the root at
    position N - 1) to the positions N, N + 1, ... of the accepted path."""
    moves = [(d + 1, i) for d, i in enumerate(path) if i != d + 1]
    if moves:
        base = seq.num_tokens - 1
        slots = engine.kv_cache.slots(engine.planner.page_table(seq.seq_id),
                                      [base + i for _, i in moves] + [base + d for d, _ in moves])
        engine.kv_cache.move(slots[:len(moves)], slots[len(moves):])
