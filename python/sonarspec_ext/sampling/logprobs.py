"""Log-probabilities of output tokens under the target's own distribution (its raw
logits: before temperature, top-k or top-p, as OpenAI's and vLLM's default ``logprobs``
report them), with the most likely alternatives."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

import torch


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: List[Tuple[int, float]] = field(default_factory=list)   # (token id, logprob), most likely first


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], num_top: int) -> List[TokenLogprob]:
    """One ``TokenLogprob`` per token: ``tokens[i]`` as drawn from row ``i`` of ``logits``
    (len(tokens), vocab_size), with the row's ``num_top`` most likely tokens."""
    if logits.dim() != 2 or logits.shape[0] != len(tokens):
        raise ValueError(f"logits of shape {list(logits.shape)} for {len(tokens)} tokens")
    if not tokens:
        return []
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(1, torch.as_tensor(list(tokens), device=logp.device)[:, None])[:, 0].tolist()
    if num_top:
        top_lp, top_ids = logp.topk(min(num_top, logp.shape[-1]), dim=-1)
        pairs = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), top_lp.tolist())]
    else:
        pairs = [[] for _ in tokens]
    return [TokenLogprob(int(t), lp, p) for t, lp, p in zip(tokens, chosen, pairs)]
