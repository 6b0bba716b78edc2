"""User-facing request and speculation parameters, validated on construction."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

# How weight matrices load (models.loader.resolve_quantization): "auto", "none", or one of
# the block formats the native GEMM runs (ops.quantized.QUANTIZED_FORMATS).
QUANTIZATION_CHOICES = ("auto", "none", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")

SPEC_METHODS = ("none", "draft_target", "mtp", "eagle_tree", "ngram")


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_TOP_K = (1 << 31) - 1
MAX_LOOKUP_DRAFT_TOKENS = 16   # SpecConfig.lookup_draft_tokens
MAX_LOGPROBS = 20   # alternatives per token, as OpenAI's top_logprobs allows
GREEDY_BELOW = 1e-5   # temperatures under this are greedy (dividing logits by them overflows)
MAX_PENALTY = 2.0     # |presence_penalty|, |frequency_penalty|, as OpenAI bounds them
MAX_LOGIT_BIAS = 100.0
MAX_REPETITION_PENALTY = 100.0


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded (immutable: a request keeps the parameters it was
    validated with; ``dataclasses.replace`` makes a changed copy).

    temperature 0 (or below 1e-5) means greedy; top_k 0 means no top-k cut; top_p 1.0
    means no nucleus cut. ``seed`` (a 64-bit signed integer) makes sampling reproducible
    regardless of batch composition. ``stop`` strings end the output before the match;
    ``stop_token_ids`` end it after the token (eos ids are added unless ``ignore_eos``).
    ``logprobs`` (0..20, None: off): each output token's log-probability under the target's
    own distribution (its raw logits: before penalties, temperature, top-k or top-p), with
    that many most likely alternatives, in ``RequestOutput.logprobs``.

    Penalties (``sampling.penalties``; greedy requests too): ``repetition_penalty`` (> 0,
    1 = off) divides the positive logits and multiplies the negative ones of every token in
    the prompt or the output so far; ``frequency_penalty`` and ``presence_penalty`` (in
    [-2, 2], 0 = off) subtract per output token its count times the one plus the other;
    ``logit_bias`` maps token ids to values in [-100, 100] added to their logits.

    ``max_draft_tokens`` (None: the engine's ``SpecConfig``) caps the drafted tokens a step
    verifies for this request - chain drafts, lookup drafts and an EAGLE tree's nodes; 0
    decodes it plainly. Its output is the same whatever the cap (speculation is lossless).
    """
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop: Optional[Union[str, Sequence[str]]] = None
    stop_token_ids: Optional[Sequence[int]] = None
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Optional[Dict[int, float]] = None
    max_draft_tokens: Optional[int] = None

    def __post_init__(self):
        _check(isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool)
               and self.max_tokens >= 1, f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        _check(_is_number(self.temperature) and self.temperature >= 0,
               f"temperature must be a number >= 0, got {self.temperature!r}")
        _check(isinstance(self.top_k, int) and not isinstance(self.top_k, bool) and 0 <= self.top_k <= MAX_TOP_K,
               f"top_k must be an integer in [0, {MAX_TOP_K}] (0 disables it), got {self.top_k!r}")
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1,
               f"top_p must be in (0, 1], got {self.top_p!r}")
        _check(self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool)
                                     and INT64_MIN <= self.seed <= INT64_MAX),
               f"seed must be None or an integer in [-2**63, 2**63), got {self.seed!r}")
        if self.temperature < GREEDY_BELOW:
            object.__setattr__(self, "temperature", 0.0)
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        _check(stop is None or isinstance(stop, (list, tuple)), f"stop must be a string or a list of strings, "
                                                                f"got {type(stop).__name__}")
        object.__setattr__(self, "stop", tuple(stop or ()))
        _check(all(isinstance(s, str) and s for s in self.stop), "stop must be non-empty strings")
        ids = self.stop_token_ids
        _check(ids is None or isinstance(ids, (list, tuple)), "stop_token_ids must be a list of integers")
        object.__setattr__(self, "stop_token_ids", tuple(ids or ()))
        _check(all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT64_MAX
                   for t in self.stop_token_ids), "stop_token_ids must be non-negative integers")
        _check(isinstance(self.ignore_eos, bool), f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        _check(self.logprobs is None or (isinstance(self.logprobs, int) and not isinstance(self.logprobs, bool)
                                         and 0 <= self.logprobs <= MAX_LOGPROBS),
               f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        _check(_is_number(self.repetition_penalty) and 0 < self.repetition_penalty <= MAX_REPETITION_PENALTY,
               f"repetition_penalty must be a number in (0, {MAX_REPETITION_PENALTY:g}] (1 disables it), "
               f"got {self.repetition_penalty!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            _check(_is_number(v) and -MAX_PENALTY <= v <= MAX_PENALTY,
                   f"{name} must be a number in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}] (0 disables it), got {v!r}")
        bias = self.logit_bias
        _check(bias is None or isinstance(bias, dict), f"logit_bias must be a dict of token id -> bias, "
                                                       f"got {type(bias).__name__}")
        for t, v in (bias or {}).items():
            _check(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT64_MAX,
                   f"logit_bias keys must be token ids (integers >= 0), got {t!r}")
            _check(_is_number(v) and -MAX_LOGIT_BIAS <= v <= MAX_LOGIT_BIAS,
                   f"logit_bias values must be numbers in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], "
                   f"got {v!r} for token {t}")
        object.__setattr__(self, "logit_bias", {t: float(v) for t, v in bias.items() if v} if bias else None)
        cap = self.max_draft_tokens
        _check(cap is None or (isinstance(cap, int) and not isinstance(cap, bool) and 0 <= cap <= INT64_MAX),
               f"max_draft_tokens must be None or an integer >= 0 (0 disables speculation), got {cap!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether the target's logits are changed before sampling (penalties or bias)."""
        return bool(self.repetition_penalty != 1.0 or self.frequency_penalty or self.presence_penalty
                    or self.logit_bias)


@dataclass
class SpecConfig:
    """Speculative decoding configuration (docs/speculation.md).

    ``eagle_tree``: ``num_draft_tokens`` is the tree depth, ``tree_top_k`` the children
    each expanded node proposes (and the nodes expanded per depth), ``tree_num_nodes`` the
    draft nodes kept (at most 63); ``tree_paths`` (EAGLE-1 style lists of child ranks, e.g.
    ``[[0], [1], [0, 0]]``) fixes the tree shape instead."""
    method: str = "none"
    draft: Optional[str] = None
    num_draft_tokens: int = 4
    tree_top_k: Optional[int] = None
    tree_num_nodes: Optional[int] = None
    tree_paths: Optional[List[List[int]]] = None
    # the drafter's weight matrices, as EngineConfig.quantization: "auto" keeps a GGUF draft
    # model's Q8_0 / Q4_0 / Q4_1 blocks, and gives a float drafter Q8_0 blocks when the
    # target is block-quantized (spec.factory.drafter_quantization);
    # "none" keeps float weights; "q8_0" ... quantize a draft model, or an MTP head's input
    # projection and layer, at load (a head's lm_head rows are the target's)
    quantization: str = "auto"
    # "mtp" / "draft_target" with greedy (top-token) chains: a chain stops where the
    # drafter's probability of the draft so far - the product of its tokens' softmax
    # probabilities - falls below this, so num_draft_tokens is the longest chain
    # (spec/draft_stop.py); 0 drafts num_draft_tokens every step
    draft_stop_prob: float = 0.0
    # "mtp" / "draft_target": where the context holds an earlier occurrence of its last 3-4
    # tokens (code being edited, quoted text), a step drafts up to this many tokens that
    # followed it instead of the drafter's chain (prompt lookup, spec/lookup.py); 0: never
    lookup_draft_tokens: int = 0

    def __post_init__(self):
        _check(self.method in SPEC_METHODS,
               f"SpecConfig.method must be one of {SPEC_METHODS}, got {self.method!r}")
        _check(self.quantization in QUANTIZATION_CHOICES,
               f"SpecConfig.quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, got {self.quantization!r}")
        _check(isinstance(self.num_draft_tokens, int) and self.num_draft_tokens >= 1,
               f"num_draft_tokens must be an integer >= 1, got {self.num_draft_tokens!r}")
        _check(isinstance(self.draft_stop_prob, (int, float)) and not isinstance(self.draft_stop_prob, bool)
               and 0.0 <= self.draft_stop_prob < 1.0,
               f"draft_stop_prob must be a number in [0, 1), got {self.draft_stop_prob!r}")
        _check(isinstance(self.lookup_draft_tokens, int) and not isinstance(self.lookup_draft_tokens, bool)
               and 0 <= self.lookup_draft_tokens <= MAX_LOOKUP_DRAFT_TOKENS,
               f"lookup_draft_tokens must be an integer in [0, {MAX_LOOKUP_DRAFT_TOKENS}], "
               f"got {self.lookup_draft_tokens!r}")
        _check(not self.lookup_draft_tokens or self.method in ("mtp", "draft_target"),
               f"lookup_draft_tokens drafts in place of a chain drafter: it takes method 'mtp' or "
               f"'draft_target', not {self.method!r}")
        for name in ("tree_top_k", "tree_num_nodes"):
            v = getattr(self, name)
            _check(v is None or (isinstance(v, int) and v >= 1), f"{name} must be None or >= 1, got {v!r}")
        _check(self.tree_top_k is None or self.tree_top_k <= 63,
               f"tree_top_k must be at most 63 (a tree holds at most 63 nodes), got {self.tree_top_k}")
        _check(self.tree_num_nodes is None or self.tree_num_nodes <= 63,
               f"tree_num_nodes must be at most 63 (a tree and its root fit one 64-bit mask), got {self.tree_num_nodes}")
        if self.tree_paths is not None:
            paths = self.tree_paths
            _check(isinstance(paths, (list, tuple)) and 0 < len(paths) <= 63 and all(
                isinstance(p, (list, tuple)) and p and all(isinstance(r, int) and r >= 0 for r in p) for p in paths),
                "tree_paths must be 1 to 63 non-empty lists of child ranks (integers >= 0)")
            given = {tuple(p) for p in paths}
            _check(len(given) == len(paths), "tree_paths lists a path twice")
            missing = [list(p) for p in given if len(p) > 1 and tuple(p[:-1]) not in given]
            _check(not missing, f"tree_paths must list every prefix of a path: {missing[0] if missing else ''} "
                                f"has no parent path")


@dataclass
class RequestOutput:
    """The result of one request."""
    request_id: int
    prompt_token_ids: List[int]
    token_ids: List[int] = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[str] = None   # "stop" | "length" | "abort" | "error"
    error: Optional[str] = None
    stats: dict = field(default_factory=dict)
    # with SamplingParams.logprobs: one per output token (sampling.logprobs.TokenLogprob)
    logprobs: Optional[list] = None


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _check(ok: bool, msg: str):
    if not ok:
        raise ValueError(msg)
