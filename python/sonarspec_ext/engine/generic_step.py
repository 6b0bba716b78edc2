"""The general engine step: any mix of prefill chunks, plain decodes, drafted chains and
draft trees in one target pass, verified on the host, then the drafter's refill."""
from __future__ import annotations

import time
from typing import List

from ..spec.proposer import StepRecord
from ..spec.verify import verify_chains, verify_tree
from ..sampling.sampler import sample


def generic_step(engine, batch, drafts) -> List:
    """Runs the step for ``batch`` with ``drafts`` (seq_id -> Draft); returns the sequences
    that received tokens."""
    t2 = time.perf_counter()
    ids, positions, meta, blocks, logits_idx = engine.pack(batch, drafts)
    out = engine.runner.forward(ids, positions, meta, logits_idx,
                                hidden_indices=slice(None) if engine.proposer.needs_hidden else None)
    logits, hidden = out if engine.proposer.needs_hidden else (out, None)
    t3 = time.perf_counter()
    chains = [(logits[offset:offset + len(draft.token_ids) + 1], draft, seq.params, seq.generator)
              for seq, start, row, n, frontier, offset, draft in blocks
              if frontier and draft is not None and draft.tree is None]
    chain_results = iter(verify_chains(chains))
    results = []
    for seq, start, row, n, frontier, offset, draft in blocks:
        tokens, accepted, used = [], 0, list(range(row, row + n))   # used: rows now valid
        if frontier:
            if draft is None:
                tokens = sample(logits[offset:offset + 1], [seq.params], [seq.generator])
            elif draft.tree is not None:
                block = logits[offset:offset + len(draft.token_ids) + 1]
                tokens, path = verify_tree(block, draft, seq.params, seq.generator)
                accepted = len(path)
                commit_tree_path(engine, seq, path)
                used += [row + n - 1 + i for i in path]
            else:
                tokens, accepted = next(chain_results)
                used += range(row + n, row + n + accepted)
        results.append((seq, start, frontier, tokens, accepted, draft, used))
    t4 = time.perf_counter()
    records = []
    for seq, start, frontier, tokens, accepted, draft, used in results:
        n_before = engine.emit(seq, tokens, accepted, draft)
        if not seq.finished:
            records.append(StepRecord(seq, start, n_before, draft, accepted, frontier,
                                      None if hidden is None else hidden[used]))
    engine.plan_ahead(records)
    t5 = time.perf_counter()
    engine.proposer.finish_step(records, engine.step_context)
    t6 = time.perf_counter()
    engine.timing["plan"] += t5 - t4
    engine.timing["draft"] += t6 - t5
    engine.timing["verify"] += t3 - t2
    engine.timing["sample"] += t4 - t3
    return [r[0] for r in results if r[2]]


def commit_tree_path(engine, seq, path: List[int]) -> None:
    """Moves the target KV of accepted tree nodes (tree-ordered slots after the root at
    position N - 1) to the positions N, N + 1, ... of the accepted path."""
    moves = [(d + 1, i) for d, i in enumerate(path) if i != d + 1]
    if moves:
        base = seq.num_tokens - 1
        slots = engine.kv_cache.slots(engine.planner.page_table(seq.seq_id),
                                      [base + i for _, i in moves] + [base + d for d, _ in moves])
        engine.kv_cache.move(slots[:len(moves)], slots[len(moves):])
