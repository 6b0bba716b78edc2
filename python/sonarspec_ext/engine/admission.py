"""What a request must be to join the engine: its prompt as token ids, checked against the
model's vocabulary and context before anything else is touched (``Engine.add_request``)."""
from __future__ import annotations

from typing import List, Union

from ..params import SamplingParams


def admitted_prompt(prompt: Union[str, List[int]], params: SamplingParams, tokenizer, vocab_size: int,
                    max_model_len: int) -> List[int]:
    """``prompt``'s token ids (a string is encoded), or ``ValueError`` saying what is wrong:
    params that are not a ``SamplingParams``, a prompt that is neither text nor token ids,
    an empty one, token ids or ``logit_bias`` ids outside the vocabulary, or a prompt that
    leaves no room in the context for a generated token."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        raise ValueError("prompt must be a string or a list of token ids")
    if not ids:
        raise ValueError("prompt is empty: at least one token is needed")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
    bias = [t for t in params.logit_bias or () if t >= vocab_size]
    if bias:
        raise ValueError(f"logit_bias token id {bias[0]} is outside the vocabulary [0, {vocab_size})")
    if len(ids) >= max_model_len:
        raise ValueError(f"prompt has {len(ids)} tokens but the context holds {max_model_len} "
                         f"(prompt plus at least one generated token)")
    return ids
