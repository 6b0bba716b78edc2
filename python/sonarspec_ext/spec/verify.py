"""Verifies one sequence's drafted chain against its target logits."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from ..engine.sampler import processed_probs, sample_from_probs
from ..ops.speculative import chain_speculative_sampling, greedy_verify
from .proposer import Draft


def verify_chain(target_logits: torch.Tensor, draft: Draft, params,
                 generator: Optional[torch.Generator]) -> Tuple[List[int], int]:
    """``target_logits``: (len(draft) + 1, vocab_size) float32, the target's logits at the
    sequence's last token and at every draft token. Returns (emitted token ids, number of
    accepted drafts); between 1 and len(draft) + 1 tokens are emitted."""
    k = len(draft.token_ids)
    if params.greedy:
        return greedy_verify(torch.tensor(draft.token_ids, dtype=torch.long), target_logits.argmax(-1))
    p = processed_probs(target_logits, params)
    if k == 0:
        return [int(sample_from_probs(p, generator)[0])], 0
    ids = torch.tensor([draft.token_ids], dtype=torch.long)
    if draft.probs is None:
        q = torch.nn.functional.one_hot(ids[0], p.shape[-1]).float()
    else:
        q = draft.probs
    out, _, emitted = chain_speculative_sampling(q.unsqueeze(0), ids, p.unsqueeze(0), generator=generator)
    a = int(emitted[0])
    return out[0, :a + 1].tolist(), a
