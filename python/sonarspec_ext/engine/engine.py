"""The engine: plan -> run -> post-process, one step at a time.

Scheduling state and KV page allocation live in the native planner (``_C.Planner``);
this class holds the models, tensors and per-request Python state.
"""
from __future__ import annotations

import gc
import itertools
import logging
import time
from typing import Dict, List, Optional, Union

import torch

from .. import _C
from ..models.config import ModelConfig
from ..models.loader import load_model, load_tokenizer, parse_dtype
from ..params import SamplingParams, SpecConfig
from ..runtime.kv_cache import KVCache, num_pages_for_budget
from ..runtime.runner import ModelRunner
from ..sampling.logprobs import token_logprobs
from ..spec.factory import make_proposer, resolve_draft, validated_acceptance
from ..spec.proposer import StepContext
from .config import EngineConfig, kv_cache_dtype
from .admission import admitted_prompt
from .failures import fail_step
from .generic_step import generic_step
from .output import OutputProcessor
from .request import Request
from .spec_control import BatchSpeculationControl
from .single_token_step import single_token_step

TIMING_KEYS = ("plan", "draft", "verify", "sample", "post", "wait")   # post: emitting tokens, planning ahead
log = logging.getLogger("sonarspec")


class Engine:
    def __init__(self, model_dir: str, device="cpu", dtype="float32", config: Optional[EngineConfig] = None,
                 spec: Optional[SpecConfig] = None):
        self.config = config or EngineConfig()
        self.spec = spec or SpecConfig()
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device {device!r} is not a device torch knows ({e})") from None
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device {device!r}: sonarspec runs on 'cpu' or 'cuda'")
        self.async_planning = (self.device.type == "cuda" if self.config.async_planning is None
                               else bool(self.config.async_planning))
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but torch sees no CUDA device")
        self.dtype = parse_dtype(dtype)
        if self.device.type == "cpu" and self.dtype != torch.float32:
            log.warning("dtype %s on the CPU runs the model op by op on torch (16-bit activations; GGUF blocks "
                        "dequantized): several times slower than the default float32, whose native kernels keep "
                        "the weights in bfloat16 or their GGUF blocks", str(self.dtype).removeprefix("torch."))
        self.model = load_model(model_dir, self.dtype, self.device, compact_weights=self.config.compact_weights,
                                quantization=self.config.quantization, load_format=self.config.load_format)
        self.model_config: ModelConfig = self.model.config
        self.tokenizer = load_tokenizer(model_dir)
        eos = list(self.model_config.eos_token_ids)
        if not eos and self.tokenizer.eos_token_id is not None:
            eos = [self.tokenizer.eos_token_id]
        self.eos_ids = eos
        c = self.config
        draft_dir, draft_cfg = resolve_draft(self.spec, model_dir, self.tokenizer, self.model_config) or (None, None)
        limits = [self.model_config.max_position_embeddings] + ([draft_cfg.max_position_embeddings] if draft_cfg else [])
        self.max_model_len = min([c.max_model_len or min(limits)] + limits)
        self.kv_dtype = kv_cache_dtype(c.kv_cache_dtype, self.model, self.device, self.dtype)
        pools = [(self.model_config, self.kv_dtype)] + ([(draft_cfg, self.dtype)] if draft_cfg else [])
        num_pages = c.num_pages or num_pages_for_budget(c.kv_cache_memory, pools, c.page_size)
        # a request never outgrows the pool: past what one sequence can hold it finishes with
        # reason "length" (the planner reserves no lookahead past max_model_len) instead of
        # waiting forever for pages
        if num_pages * c.page_size < 2:
            raise ValueError(f"the KV pool ({num_pages} pages of {c.page_size} tokens) cannot hold a prompt token "
                             f"and a generated token: raise num_pages or kv_cache_memory")
        self.max_model_len = min(self.max_model_len, num_pages * c.page_size)
        self.kv_cache = KVCache(self.model_config, num_pages, c.page_size, self.kv_dtype, self.device)
        self.runner = ModelRunner(self.model, self.kv_cache)
        pc = _C.PlannerConfig()
        pc.num_pages, pc.page_size = num_pages, c.page_size
        pc.max_num_seqs, pc.max_num_batched_tokens = c.max_num_seqs, c.max_num_batched_tokens
        pc.max_model_len = self.max_model_len
        pc.enable_prefix_caching = bool(c.enable_prefix_caching)
        self.planner = _C.Planner(pc)
        self.proposer = make_proposer(self.spec, draft_dir, self.model, self.planner, num_pages, c.page_size,
                                      self.dtype, self.device, c.draft_sampling)
        head = getattr(self.proposer, "head", None)
        if head is not None and head.feature_layers:   # the head reads intermediate target layers too
            self.runner.fuse_layers(head.feature_layers, head.target_features)
        if c.cuda_graphs or (c.cuda_graphs is None and self.device.type == "cuda"):
            if self.device.type != "cuda":
                raise ValueError(f"cuda_graphs needs a CUDA device, not {self.device.type!r}")
            for runner in self.runners():
                runner.use_cuda_graphs(max_tokens=c.cuda_graph_max_tokens)
        self.seqs: Dict[int, Request] = {}
        self._ids = itertools.count()
        self.timing = dict.fromkeys(TIMING_KEYS, 0.0)
        self._next_plan = None   # PlanHandle of the step planned ahead (async_planning)
        self.step_context = StepContext()   # the running step's, handed to the proposer after it
        speculating = self.spec.method != "none"
        self.spec_control = (BatchSpeculationControl(modes=self._adaptive_modes(),
                                                     lookup_drafts=self.spec.lookup_draft_tokens > 0,
                                                     prior_acceptance=validated_acceptance(draft_dir, self.spec.method))
                             if c.adaptive_speculation and speculating else None)
        self.num_steps = 0
        # positions a drafter re-runs after a speculating step: the last token and the drafts kept
        self._usual_backlog = 1 + max(self.proposer.max_draft_tokens, self.spec.lookup_draft_tokens)
        # steps with decoding sequences of a speculating engine: drafted for some, or paused by
        # the load control (spec_max_batch, adaptive speculation)
        self.decode_steps = {"speculating": 0, "paused": 0}
        self.output = OutputProcessor(self.tokenizer, self.planner, self.proposer, self.max_model_len,
                                      c.enable_prefix_caching)
        self.finished = self.output.finished   # statistics of finished requests, as running totals
        self._step_seq_ids: List[int] = []   # the running step's sequences (failed together if it raises)
        if c.freeze_gc:
            gc.freeze()

    def runners(self) -> List[ModelRunner]:
        """The target's runner and the drafter's, if it has one."""
        drafter = getattr(self.proposer, "runner", None)
        return [self.runner] + ([drafter] if drafter is not None else [])

    # ---- requests -------------------------------------------------------------------
    def add_request(self, prompt: Union[str, List[int]], params: SamplingParams) -> int:
        """Queues a request; raises ``ValueError`` for bad input without touching others."""
        ids = admitted_prompt(prompt, params, self.tokenizer, self.model_config.vocab_size, self.max_model_len)
        seq_id = next(self._ids)
        self.planner.add_request(seq_id, len(ids), ids if self.config.enable_prefix_caching else [])
        self.seqs[seq_id] = Request(seq_id, ids, params, self.eos_ids, self.device, self.tokenizer)
        return seq_id

    def abort(self, seq_id: int) -> None:
        seq = self.seqs.get(seq_id)
        if seq is not None and not seq.finished:
            self.output.finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return any(not s.finished for s in self.seqs.values())

    def pop_finished(self, seq_id: int) -> Request:
        return self.seqs.pop(seq_id)

    # ---- one step -------------------------------------------------------------------
    def _adaptive_modes(self) -> tuple:
        """Draft lengths adaptive speculation chooses among: chains from the configured
        length down to 1 (trees: 1, their own shape); and 0, plain decoding."""
        k = self.proposer.max_draft_tokens
        return (1, 0) if self.spec.method == "eagle_tree" or k < 1 else tuple(range(k, -1, -1))

    def _num_drafts(self, seq: Request) -> int:
        """Draft length for a decoding sequence: never past the context or max_tokens."""
        return max(0, min(self.proposer.max_draft_tokens, seq.draft_room(self.max_model_len)))

    def step(self) -> List[Request]:
        """Runs one engine step (plan -> draft -> verify -> sample -> post-process); returns
        the sequences that received tokens. Torch's own ops run single-threaded meanwhile
        (the runner's ``runtime.threads.ThreadPolicy``; large prefill chunks get the threads back).

        A step that raises finishes the sequences it had scheduled with reason ``"error"``
        (the exception's text in ``error``), releasing their pages; the engine stays
        consistent and serves everything else. An ``Exception`` raised before the step
        scheduled any sequence (its planning failed, and would fail again at every retry)
        finishes every unfinished sequence so. An ``Exception`` is not re-raised; anything
        else (``KeyboardInterrupt``) is, after the clean-up."""
        self._step_seq_ids = []
        with self.runner.threads.native():
            try:
                return self._step()
            except BaseException as e:
                fail_step(self, e)
                if not isinstance(e, Exception):
                    raise
                return []

    def _step(self) -> List[Request]:
        t0 = time.perf_counter()
        scheduled, preempted, cached = self._plan()
        self._step_seq_ids = [sid for sid, _, _ in scheduled]
        for sid in preempted:
            if sid in self.seqs:
                self.seqs[sid].num_preemptions += 1
                self.seqs[sid].kv_len = self.seqs[sid].cached_len = 0
                self.proposer.reset(self.seqs[sid])
        for sid, num_tokens in cached:   # admitted with their first tokens' KV from the prefix cache
            if sid in self.seqs and not self.seqs[sid].finished:
                self.seqs[sid].num_cached_tokens = num_tokens
                self.proposer.adopt_prefix(self.seqs[sid], num_tokens)
        if not scheduled:
            return []
        batch = [(self.seqs[sid], start, n) for sid, start, n in scheduled]
        if self.config.enable_prefix_caching:
            # the target runs these positions; read once it has (a finish inside the step,
            # _cache_full_pages after it) - a failed step caches nothing
            for seq, start, n in batch:
                seq.kv_len = max(seq.kv_len, start + n)
        decoding = [seq for seq, start, n in batch if n == 1 and start == seq.num_tokens - 1]
        # Under load (more decoding sequences than spec_max_batch) the step decodes plainly
        # and drafters defer their refills, catching up once speculation resumes. A step that
        # only prefills is judged by the sequences it prefills, which decode next.
        limit, load = self.config.spec_max_batch, len(decoding) or len(batch)
        control = self.spec_control.for_batch(load) if self.spec_control is not None else None
        self.step_context = StepContext(paused=(limit is not None and load > limit)
                                        or (control is not None and not control.speculate))
        before = [seq.num_tokens for seq in decoding] if control is not None else []
        decode = [] if self.step_context.paused else [seq for seq in decoding if self.proposer.ready(seq)]
        cap = control.mode if control is not None else self.proposer.max_draft_tokens
        ks = [min(cap, self._num_drafts(seq)) for seq in decode]
        # a drafter catching up on a prompt (or on paused steps) costs what no steady step does; it
        # runs the re-runs waiting for every decoding sequence, drafted for or not
        caught_up = control is not None and max((self.proposer.backlog(seq) for seq in decoding),
                                                default=0) > self._usual_backlog
        t1 = time.perf_counter()
        drafts = dict(zip((s.seq_id for s in decode), self.proposer.propose(decode, ks)))
        t2 = time.perf_counter()
        if self.proposer.single_token_schedule and decode and len(decode) == len(batch) and all(
                len(d.token_ids) == 1 and not d.lookup for d in drafts.values()) and not any(
                s.params.penalized for s in decode):
            got_tokens = single_token_step(self, batch, drafts)
        else:
            got_tokens = generic_step(self, batch, drafts)
        self.timing["plan"] += t1 - t0
        self.timing["draft"] += t2 - t1
        self.num_steps += 1
        if decoding and self.spec.method != "none" and (self.step_context.paused or decode):
            self.decode_steps["paused" if self.step_context.paused else "speculating"] += 1
        if control is not None and decoding:
            gained = [seq.num_tokens - n for seq, n in zip(decoding, before)]
            control.record(time.perf_counter() - t0, sum(gained),
                           measured=len(decoding) == len(batch) and not caught_up,
                           sequences=len(decoding), accepted=[max(g - 1, 0) for g in gained],
                           lookup=[seq.seq_id in drafts and drafts[seq.seq_id].lookup for seq in decoding])
        if self.config.enable_prefix_caching:
            self._cache_full_pages(batch)
        if self._plan_ahead_possible():
            self._next_plan = self.planner.schedule_async(self.proposer.lookahead)
        return got_tokens

    def _cache_full_pages(self, batch) -> None:
        """Hands the prefix cache the pages of the step's running requests (prefill chunks
        included) that have filled with KV valid in every model, so that requests admitted
        meanwhile find them."""
        page = self.config.page_size
        for seq, _, _ in batch:
            if seq.finished:
                continue
            valid = self.output.valid_kv(seq)
            if valid // page > seq.cached_len // page:
                self.planner.cache_prefix(seq.seq_id, seq.all_ids, valid)
                seq.cached_len = valid

    def _plan_ahead_possible(self) -> bool:
        return self.async_planning and self._next_plan is None and self.has_unfinished()

    def _plan(self):
        """This step's plan: the one computed ahead on the planner's thread (the wait is
        timed), else planned now. Sequences finished since it was planned are dropped."""
        if self._next_plan is None:
            return self.planner.schedule(self.proposer.lookahead)
        t = time.perf_counter()
        scheduled, preempted, cached = self._next_plan.wait()
        self._next_plan = None
        self.timing["wait"] += time.perf_counter() - t
        live = lambda sid: sid in self.seqs and not self.seqs[sid].finished  # noqa: E731
        return [s for s in scheduled if live(s[0])], preempted, cached

    def emit(self, seq: Request, tokens: List[int], accepted: int, draft, logits=None) -> int:
        """Appends a step's tokens to ``seq`` and commits its verified KV; returns the
        sequence's length before the step. ``logits`` (len(tokens), vocab) - the target's
        rows each token was drawn from - give their log-probabilities when the request
        asks for them (``SamplingParams.logprobs``)."""
        n_before = seq.num_tokens
        if draft is not None:
            seq.record_verification(len(draft.token_ids), accepted, draft.depth, draft.lookup)
        entries = None
        if seq.logprobs is not None and logits is not None:
            entries = token_logprobs(logits, tokens, seq.params.logprobs)
        self.output.append(seq, tokens)
        if entries is not None:   # as many as the tokens kept (a stop condition may end the step early)
            seq.logprobs.extend(entries[:len(seq.output_ids) - len(seq.logprobs)])
        if draft is not None and not seq.finished:  # KV is valid through the accepted drafts
            self.planner.commit(seq.seq_id, n_before + accepted)
        return n_before

    def plan_ahead(self, records) -> None:
        """Plans the next step on the planner's thread while the drafter refills from
        ``records``, using page tables captured now (the plan may grow or release pages)."""
        if self._plan_ahead_possible():
            self.step_context.tables = {r.seq.seq_id: self.planner.page_table(r.seq.seq_id) for r in records}
            self._next_plan = self.planner.schedule_async(self.proposer.lookahead)
