"""The engine: plan -> run -> post-process, one step at a time.

Scheduling state and KV page allocation live in the native planner (``_C.Planner``);
this class holds the models, tensors and per-request Python state.
"""
from __future__ import annotations

import gc
import itertools
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Dict, List, Optional, Union

import numpy as np
import torch

from .. import _C
from ..models.config import ModelConfig
from ..models.loader import (QUANTIZATION_CHOICES, has_compact_weights, load_model, load_tokenizer,
                             parse_dtype)
from ..ops.linear import native_gemm_threads
from ..params import SamplingParams, SpecConfig
from ..runtime.kv_cache import KVCache, num_pages_for_budget
from .blocks import Block
from .detokenize import stop_prefix_len
from .spec_control import BatchSpeculationControl
from .request_stats import RequestTotals
from ..runtime.runner import ModelRunner
from .sequence import Sequence
from ..spec.factory import make_proposer, resolve_draft
from ..spec.proposer import StepContext
from .generic_step import generic_step
from .sync_free import sync_free_step
from ..runtime.cuda_graphs import StepGraphs
from ..runtime.metadata import TreeBlock
from ..runtime.transfer import to_device

TIMING_KEYS = ("plan", "draft", "verify", "sample", "wait")
log = logging.getLogger("sonarspec")


KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class EngineConfig:
    page_size: int = 16
    kv_cache_memory: int = 256 << 20   # bytes for all KV pools together
    num_pages: Optional[int] = None     # overrides kv_cache_memory
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: Optional[int] = None  # default: the model's max_position_embeddings
    draft_sampling: bool = False         # draft_target: sample drafts from q instead of its top token
    spec_max_batch: Optional[int] = None  # speculate only while at most this many sequences decode
    # speculate only while it measures faster than plain decoding (engine/spec_control.py)
    adaptive_speculation: bool = False
    # plan step t + 1 on the planner's thread once step t is done; None: where the models run on a
    # GPU (the host plans while the device computes), not on the CPU (the planner's thread would
    # compete with the kernels' threads for the cores)
    async_planning: Optional[bool] = None
    # CUDA only: small steps whose sequences all have the same number of query tokens
    # (decoding, chain verification, draft rounds) run as CUDA graphs (runtime/cuda_graphs.py)
    cuda_graphs: bool = False
    freeze_gc: bool = True   # gc.freeze() once built: full collections skip the loaded libraries
    # float32 on the CPU: weight matrices in bfloat16 (models.loader.load_model); False: float32 copies
    compact_weights: bool = True
    # the target's KV pools: "auto" (bfloat16 on the CPU when the weights are bfloat16, else the
    # compute dtype), "float32", "bfloat16" or "float16" (16-bit pools halve the bytes attention
    # reads per token; values are rounded to nearest even as they are stored)
    kv_cache_dtype: str = "auto"
    # the target's weight matrices (models.loader.resolve_quantization): "auto" keeps a GGUF
    # file's Q8_0 / Q4_0 / Q4_1 blocks (CPU, float32 activations), "none" dequantizes at load,
    # "q8_0" / "q4_0" / "q4_1" quantize any checkpoint at load
    quantization: str = "auto"

    def __post_init__(self):
        for name in ("page_size", "kv_cache_memory", "max_num_seqs", "max_num_batched_tokens", "num_pages",
                     "max_model_len"):
            v = getattr(self, name)
            if v is None and name in ("num_pages", "max_model_len"):
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.quantization not in QUANTIZATION_CHOICES:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, "
                             f"got {self.quantization!r}")
        if self.spec_max_batch is not None and (not isinstance(self.spec_max_batch, int) or self.spec_max_batch < 0):
            raise ValueError(f"spec_max_batch must be None or an integer >= 0, got {self.spec_max_batch!r}")


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
        self.model = load_model(model_dir, self.dtype, self.device, compact_weights=self.config.compact_weights,
                                quantization=self.config.quantization)
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
        self.kv_dtype = self._kv_dtype()
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
        self.planner = _C.Planner(pc)
        self.proposer = make_proposer(self.spec, draft_dir, self.model, self.planner, num_pages, c.page_size,
                                      self.dtype, self.device, c.draft_sampling)
        if c.cuda_graphs:
            if self.device.type != "cuda":
                raise ValueError(f"cuda_graphs needs a CUDA device, not {self.device.type!r}")
            for runner in self.runners():
                runner.graphs = StepGraphs(runner)
        self.seqs: Dict[int, Sequence] = {}
        self._ids = itertools.count()
        self.timing = dict.fromkeys(TIMING_KEYS, 0.0)
        self._next_plan = None   # PlanHandle of the step planned ahead (async_planning)
        self.step_context = StepContext()   # the running step's, handed to the proposer after it
        speculating = self.spec.method != "none"
        self.spec_control = (BatchSpeculationControl(modes=self._adaptive_modes())
                             if c.adaptive_speculation and speculating else None)
        self.num_steps = 0
        self.finished = RequestTotals()   # statistics of finished requests, as running totals
        # wraps the region of the single-token MTP schedule that must not wait for the host
        # (``sync_free.forbid_host_syncs`` or ``cuda_sync_guard`` make a sync there raise)
        self.sync_guard = nullcontext
        self._step_seq_ids: List[int] = []   # the running step's sequences (failed together if it raises)
        if c.freeze_gc:
            gc.freeze()

    def _kv_dtype(self) -> torch.dtype:
        """The target's KV pool dtype (EngineConfig.kv_cache_dtype); drafters keep theirs in
        the compute dtype."""
        name = self.config.kv_cache_dtype
        if name == "auto":
            compact = has_compact_weights(self.model)
            return torch.bfloat16 if self.device.type == "cpu" and compact else self.dtype
        kv = parse_dtype(name)
        if self.device.type == "cuda" and kv != self.dtype:
            raise ValueError(f"kv_cache_dtype {name!r}: on CUDA the KV cache keeps the compute dtype ({self.dtype})")
        if self.device.type == "cpu" and self.dtype != torch.float32 and kv != self.dtype:
            raise ValueError(f"kv_cache_dtype {name!r}: with compute dtype {self.dtype} the KV cache keeps it")
        return kv

    def runners(self) -> List[ModelRunner]:
        """The target's runner and the drafter's, if it has one."""
        drafter = getattr(self.proposer, "runner", None)
        return [self.runner] + ([drafter] if drafter is not None else [])

    # ---- requests -------------------------------------------------------------------
    def add_request(self, prompt: Union[str, List[int]], params: SamplingParams) -> int:
        """Queues a request; raises ``ValueError`` for bad input without touching others."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            raise ValueError("prompt must be a string or a list of token ids")
        if not ids:
            raise ValueError("prompt is empty: at least one token is needed")
        bad = [t for t in ids if not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary "
                             f"[0, {self.model_config.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens but the context holds {self.max_model_len} "
                             f"(prompt plus at least one generated token)")
        seq_id = next(self._ids)
        self.planner.add_request(seq_id, len(ids))
        self.seqs[seq_id] = Sequence(seq_id, ids, params, self.eos_ids, self.device, self.tokenizer)
        return seq_id

    def abort(self, seq_id: int) -> None:
        seq = self.seqs.get(seq_id)
        if seq is not None and not seq.finished:
            self._finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return any(not s.finished for s in self.seqs.values())

    def pop_finished(self, seq_id: int) -> Sequence:
        return self.seqs.pop(seq_id)

    # ---- one step -------------------------------------------------------------------
    def _adaptive_modes(self) -> tuple:
        """Draft lengths adaptive speculation chooses among: chains from the configured
        length down to 1 (trees: 1, their own shape); and 0, plain decoding."""
        k = self.proposer.max_draft_tokens
        return (1, 0) if self.spec.method == "eagle_tree" or k < 1 else tuple(range(k, -1, -1))

    def _num_drafts(self, seq: Sequence) -> int:
        """Draft length for a decoding sequence: never past the context or max_tokens."""
        room = min(self.max_model_len - seq.num_tokens - 1, seq.params.max_tokens - len(seq.output_ids) - 1)
        return max(0, min(self.proposer.max_draft_tokens, room))

    def step(self) -> List[Sequence]:
        """Runs one engine step (plan -> draft -> verify -> sample -> post-process); returns
        the sequences that received tokens. Torch's own ops run single-threaded meanwhile
        (``native_gemm_threads``; large prefill chunks get the threads back).

        A step that raises finishes the sequences it had scheduled with reason ``"error"``
        (the exception's text in ``error``), releasing their pages; the engine stays
        consistent and serves everything else. An ``Exception`` is not re-raised; anything
        else (``KeyboardInterrupt``) is, after the clean-up."""
        self._step_seq_ids = []
        with native_gemm_threads():
            try:
                return self._step()
            except BaseException as e:
                self._fail_step(e)
                if not isinstance(e, Exception):
                    raise
                return []

    def _fail_step(self, error: BaseException) -> None:
        log.error("engine step failed (%s: %s); its %d request(s) finish with an error", type(error).__name__,
                  error, len(self._step_seq_ids), exc_info=error)
        if self._next_plan is not None:
            try:
                self._next_plan.wait()
            finally:
                self._next_plan = None
        for sid in self._step_seq_ids:
            seq = self.seqs.get(sid)
            if seq is not None and not seq.finished:
                seq.error = f"{type(error).__name__}: {error}"
                try:
                    self._finish(seq, "error")
                except Exception:   # the state that failed may fail again: free the pages regardless
                    seq.finish_reason = "error"
                    if self.planner.has(sid):
                        self.planner.finish(sid)

    def _step(self) -> List[Sequence]:
        t0 = time.perf_counter()
        scheduled, preempted = self._plan()
        self._step_seq_ids = [sid for sid, _, _ in scheduled]
        for sid in preempted:
            if sid in self.seqs:
                self.seqs[sid].num_preemptions += 1
                self.proposer.reset(self.seqs[sid])
        if not scheduled:
            return []
        batch = [(self.seqs[sid], start, n) for sid, start, n in scheduled]
        decoding = [seq for seq, start, n in batch if n == 1 and start == seq.num_tokens - 1]
        # Under load (more decoding sequences than spec_max_batch) the step decodes plainly
        # and drafters defer their refills, catching up once speculation resumes.
        limit = self.config.spec_max_batch
        control = self.spec_control.for_batch(len(decoding)) if self.spec_control is not None else None
        self.step_context = StepContext(paused=(limit is not None and len(decoding) > limit)
                                        or (control is not None and not control.speculate))
        before = sum(seq.num_tokens for seq in decoding) if control is not None else 0
        decode = [] if self.step_context.paused else [seq for seq in decoding if self.proposer.ready(seq)]
        cap = control.mode if control is not None else self.proposer.max_draft_tokens
        ks = [min(cap, self._num_drafts(seq)) for seq in decode]
        t1 = time.perf_counter()
        drafts = dict(zip((s.seq_id for s in decode), self.proposer.propose(decode, ks)))
        t2 = time.perf_counter()
        if self.proposer.sync_free and decode and len(decode) == len(batch) and all(
                len(d.token_ids) == 1 for d in drafts.values()):
            got_tokens = sync_free_step(self, batch, drafts)
        else:
            got_tokens = generic_step(self, batch, drafts)
        self.timing["plan"] += t1 - t0
        self.timing["draft"] += t2 - t1
        self.num_steps += 1
        if control is not None and decoding:
            control.record(time.perf_counter() - t0, sum(seq.num_tokens for seq in decoding) - before,
                           measured=len(decoding) == len(batch))
        if self._plan_ahead_possible():
            self._next_plan = self.planner.schedule_async(self.proposer.lookahead)
        return got_tokens

    def _plan_ahead_possible(self) -> bool:
        return self.async_planning and self._next_plan is None and self.has_unfinished()

    def _plan(self):
        """This step's plan: the one computed ahead on the planner's thread (the wait is
        timed), else planned now. Sequences finished since it was planned are dropped."""
        if self._next_plan is None:
            return self.planner.schedule(self.proposer.lookahead)
        t = time.perf_counter()
        scheduled, preempted = self._next_plan.wait()
        self._next_plan = None
        self.timing["wait"] += time.perf_counter() - t
        live = lambda sid: sid in self.seqs and not self.seqs[sid].finished  # noqa: E731
        return [s for s in scheduled if live(s[0])], preempted

    def pack(self, batch, drafts):
        """The target's packed input for a step: prefill chunks, and for decoding sequences
        their last token plus drafts. Returns (input_ids, positions, metadata, blocks,
        logits_indices) with one ``Block`` per sequence."""
        input_ids: List[int] = []
        starts, lens, logits_idx, blocks, trees = [], [], [], [], []
        for seq, start, n in batch:
            toks = seq.all_ids[start:start + n]
            draft = drafts.get(seq.seq_id)
            tree = None if draft is None else draft.tree
            if draft is not None:
                toks = toks + draft.token_ids
            # a tree's root (the last token) and nodes sit in tree order from ``start``
            trees.append(None if tree is None else TreeBlock(start, tree.ancestor_bits(), start + tree.depths))
            row = len(input_ids)
            input_ids.extend(toks)
            starts.append(start)
            lens.append(len(toks))
            at_end = start + n == seq.num_tokens   # the step reaches the sequence's last token
            blocks.append(Block(seq, start, row, n, at_end, len(logits_idx), draft))
            if at_end:
                logits_idx.extend(range(row + n - 1, len(input_ids)))
        meta, positions = self.runner.planner_metadata(self.planner, [s.seq_id for s, *_ in batch], starts, lens,
                                                       self.model_config.sliding_window, trees)
        ids, logits_idx = to_device([np.asarray(input_ids, dtype=np.int64), np.asarray(logits_idx, dtype=np.int64)],
                                    self.device)
        return ids, positions, meta, blocks, logits_idx

    def emit(self, seq: Sequence, tokens: List[int], accepted: int, draft) -> int:
        """Appends a step's tokens to ``seq`` and commits its verified KV; returns the
        sequence's length before the step."""
        n_before = seq.num_tokens
        if draft is not None:
            seq.record_verification(len(draft.token_ids), accepted, draft.depth)
        self._append(seq, tokens)
        if draft is not None and not seq.finished:  # KV is valid through the accepted drafts
            self.planner.commit(seq.seq_id, n_before + accepted)
        return n_before

    def plan_ahead(self, records) -> None:
        """Plans the next step on the planner's thread while the drafter refills from
        ``records``, using page tables captured now (the plan may grow or release pages)."""
        if self._plan_ahead_possible():
            self.step_context.tables = {r.seq.seq_id: self.planner.page_table(r.seq.seq_id) for r in records}
            self._next_plan = self.planner.schedule_async(self.proposer.lookahead)

    # ---- post-processing ------------------------------------------------------------
    def _append(self, seq: Sequence, tokens: List[int]) -> None:
        """Appends emitted tokens, stopping exactly at the first stop condition."""
        if seq.first_token_time is None and tokens:
            seq.first_token_time = time.perf_counter()
        p = seq.params
        for tok in tokens:
            seq.output_ids.append(tok)
            self.planner.append_tokens(seq.seq_id, 1)
            reason, text = None, None
            if tok in seq.stop_ids:
                reason = "stop"
            elif len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
                reason = "length"
            if p.stop:
                # only the text added since the last check can complete a stop string
                full = seq.detok.update(seq.output_ids)
                start = max(0, min(seq.stop_checked, len(full)) - max(len(s) for s in p.stop) + 1)
                cut = _find_stop(full[start:], p.stop)
                seq.stop_checked = len(full)
                if cut is not None:
                    text, reason = full[:start + cut], "stop"
            if reason is not None:
                self._finish(seq, reason, text)
                return

    def _finish(self, seq: Sequence, reason: str, text: Optional[str] = None) -> None:
        seq.text = text if text is not None else self.tokenizer.decode(seq.output_ids)
        seq.finish_reason = reason
        if self.planner.has(seq.seq_id):
            self.planner.finish(seq.seq_id)
        self.proposer.reset(seq)
        self.finished.add(seq.stats(), seq.finish_reason)

    def text_so_far(self, seq: Sequence) -> str:
        """The output's text: final once finished, else up to its last complete character."""
        return seq.text if seq.finished else seq.detok.update(seq.output_ids)

    def stream_text(self, seq: Sequence) -> str:
        """The text a stream may hand out now: all of it once finished, else without a
        tail that could still begin a stop string (the next tokens may complete it) or end
        inside a UTF-8 character."""
        text = self.text_so_far(seq)
        if not seq.finished:
            text = text.rstrip("\ufffd")
            text = text[:len(text) - stop_prefix_len(text, seq.params.stop)]
        return text


def _find_stop(text: str, stops: List[str]) -> Optional[int]:
    """Earliest position of any stop string in ``text``, or None."""
    best = None
    for s in stops:
        i = text.find(s)
        if i != -1 and (best is None or i < best):
            best = i
    return best
