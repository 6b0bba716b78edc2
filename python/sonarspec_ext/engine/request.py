"""``Request``: one request's state on the Python side of the engine (its tokens, sampling
stream, text, statistics); the planner holds its pages."""
from __future__ import annotations

import time
from typing import List, Optional

import torch

from .detokenize import IncrementalText
from ..sampling.uniforms import GeneratorUniforms, KeyedUniforms, new_generator
from ..params import RequestOutput, SamplingParams


class Request:
    def __init__(self, seq_id: int, prompt_ids: List[int], params: SamplingParams,
                 eos_ids: List[int], device, tokenizer):
        self.seq_id = seq_id
        self.prompt_ids = list(prompt_ids)
        self.output_ids: List[int] = []
        self.params = params
        self.stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_ids))
        self.device = device
        # sampled: seeded requests' uniforms are keyed by output position (sampling.uniforms),
        # the others come from a generator of their own
        self.keyed_sampling = not params.greedy and params.seed is not None
        self.generator: Optional[torch.Generator] = None
        if not params.greedy and not self.keyed_sampling:
            self.generator = new_generator(device)
        self.text = ""
        self.detok = IncrementalText(tokenizer)   # the output's text as it grows
        self.stop_checked = 0        # characters of that text already searched for stop strings
        self.num_emitted_chars = 0   # text already handed out by stream()
        self.finish_reason: Optional[str] = None
        self.error: Optional[str] = None
        self.arrival = time.perf_counter()
        self.first_token_time: Optional[float] = None
        self.num_steps = 0            # verification (decode) steps
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_lookup_steps = 0             # steps whose drafts came from the context (Draft.lookup)
        self.num_lookup_accepted_tokens = 0   # their drafts accepted
        self.drafted_per_position: List[int] = []   # steps that proposed a token at position k
        self.accepted_per_position: List[int] = []  # steps that accepted it
        self.num_preemptions = 0
        self.num_cached_tokens = 0   # prompt tokens whose KV came from the prefix cache (last admission)
        self.kv_len = 0              # positions below it hold the target's KV (set as a step runs them)
        self.cached_len = 0          # positions below it were offered to the prefix cache (full pages cached)
        # with params.logprobs: one sampling.logprobs.TokenLogprob per output token
        self.logprobs: Optional[list] = None if params.logprobs is None else []
        self.token_counts = None   # with penalties: sampling.penalties.TokenCounts, made at the first step

    def uniforms(self, offset: int, count: int) -> torch.Tensor:
        """(count,) float64 uniforms for the output tokens ``offset`` and on past the ones
        produced so far: keyed by their positions (seeded requests), else the next draws of
        the request's generator."""
        if self.keyed_sampling:
            return KeyedUniforms(self.params.seed, len(self.output_ids), self.device).uniforms(offset, count)
        return GeneratorUniforms(self.generator).uniforms(offset, count)

    @property
    def all_ids(self) -> List[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def draft_room(self, max_model_len: int) -> int:
        """The most draft tokens a step may verify for this request (may be negative): every
        draft that is kept adds a token, and none may pass the context or ``max_tokens``, nor
        their number the request's ``max_draft_tokens``."""
        room = min(max_model_len - self.num_tokens - 1, self.params.max_tokens - len(self.output_ids) - 1)
        cap = self.params.max_draft_tokens
        return room if cap is None else min(room, cap)

    def record_verification(self, num_drafts: int, num_accepted: int, depth: Optional[int] = None,
                            lookup: bool = False) -> None:
        """One verification step: ``num_drafts`` drafted tokens, ``num_accepted`` accepted;
        per-position counts go by ``depth`` (a tree's depth; a chain's length by default);
        ``lookup``: the drafts came from the context (lookup drafts)."""
        depth = num_drafts if depth is None else depth
        self.num_steps += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        if lookup:
            self.num_lookup_steps += 1
            self.num_lookup_accepted_tokens += num_accepted
        grow = depth - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for k in range(depth):
            self.drafted_per_position[k] += 1
            self.accepted_per_position[k] += int(k < num_accepted)

    def stats(self) -> dict:
        return {
            "num_steps": self.num_steps,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_lookup_steps": self.num_lookup_steps,
            "num_lookup_accepted_tokens": self.num_lookup_accepted_tokens,
            "acceptance_length": ((self.num_accepted_tokens + self.num_steps) / self.num_steps
                                  if self.num_steps else 0.0),
            "accepted_per_position": [a / d for a, d in zip(self.accepted_per_position, self.drafted_per_position)],
            "drafted_per_position": list(self.drafted_per_position),
            "num_accepted_per_position": list(self.accepted_per_position),
            "num_prompt_tokens": len(self.prompt_ids),
            "num_cached_tokens": self.num_cached_tokens,
            "num_output_tokens": len(self.output_ids),
            "num_preemptions": self.num_preemptions,
            "ttft_s": None if self.first_token_time is None else self.first_token_time - self.arrival,
        }

    def to_output(self) -> RequestOutput:
        return RequestOutput(request_id=self.seq_id, prompt_token_ids=self.prompt_ids,
                             token_ids=list(self.output_ids), text=self.text,
                             finish_reason=self.finish_reason, error=self.error, stats=self.stats(),
                             logprobs=None if self.logprobs is None else list(self.logprobs))
