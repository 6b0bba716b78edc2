"""Runs one model over a packed batch on its paged KV cache."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..layers.attention import PagedAttentionMetadata, TorchPagedAttention
from ..models.llama import vocab_logits
from ..models.loader import has_compact_weights
from ..ops.limits import CUDA_GRAPH_MAX_TOKENS, NATIVE_ATTENTION_MAX_TOKENS
from ..ops.paged_attention import cuda_attention_supports
from ..ops.stack_drafting import block_table, decode_rows_forward, fits, refill_chain, rows_forward
from .kv_cache import KVCache
from .execution import ExecutionPolicy
from .threads import ThreadPolicy
from .metadata import TreeBlock, build_metadata, planner_metadata
from .native_stack import build_native_stack, run_native_stack
from .transfer import to_device


class ModelRunner:
    def __init__(self, model, kv_cache: KVCache):
        """``model``: a ``LlamaForCausalLM`` or an ``MTPHead`` (which also reads ``features``)."""
        self.model, self.kv_cache = model, kv_cache
        self.dtype = model.compute_dtype
        self.compact = has_compact_weights(model)
        self.device = kv_cache.k.device
        self._stack = None   # the model's layers as one native call, built at the first small step
        self._stack_built = False
        self.graphs = None   # runtime.cuda_graphs.StepGraphs once use_cuda_graphs() is called
        # CUDA: attention through ops.paged_attention's kernel (per-token key lists) where it
        # takes the head size; False: torch SDPA over gathered K/V with a mask
        self.cuda_attention = self.device.type == "cuda" and cuda_attention_supports(kv_cache.k.shape[-1])
        self.policy = ExecutionPolicy()   # picks each forward's path and counts them
        self.threads = ThreadPolicy()     # the threads its native kernels and torch's ops get
        self.capture: Tuple[int, ...] = ()   # target layers a drafter reads besides the final states
        self._fuse = None

    def fuse_layers(self, layers: Sequence[int], fuse) -> None:
        """From now on the hidden states ``forward`` returns are ``fuse(final, streams)``:
        the final states and the residual streams after ``layers`` ((n, len(layers),
        hidden)) - the features of a drafter that reads intermediate layers (EAGLE-3 style).
        No layers: the final states, as before."""
        self.capture, self._fuse = tuple(layers), fuse if layers else None

    def use_cuda_graphs(self, capture: bool = True, max_tokens: int = CUDA_GRAPH_MAX_TOKENS) -> None:
        """Uniform steps of up to ``max_tokens`` tokens on this runner run as CUDA graphs
        from now on (``runtime.cuda_graphs.StepGraphs``; ``capture`` False runs their
        static-buffer forward eagerly, for tests)."""
        from .cuda_graphs import StepGraphs
        self.graphs = StepGraphs(self, capture=capture, max_tokens=max_tokens)

    def stack(self):
        """The model's layers as one native call (``ops.DecoderStack``) on this cache, built
        at the first use; None where the model cannot run as one."""
        if not self._stack_built:
            self._stack, self._stack_built = build_native_stack(self.model, self.kv_cache), True
        return self._stack

    @property
    def native_attention(self) -> bool:
        """Whether this runner's steps take the attention kernels' per-token key lists
        (float32 models on the CPU outside CUDA graphs; CUDA models with ``cuda_attention``)."""
        if self.device.type == "cuda":
            return self.cuda_attention
        return self.dtype == torch.float32 and self.graphs is None

    def metadata(self, rows: Sequence[Tuple[int, int, Sequence[int]]], sliding_window: Optional[int] = None,
                 trees: Optional[List[Optional[TreeBlock]]] = None):
        """``build_metadata`` for this model's cache, with the kernels' key lists where
        ``native_attention``."""
        return build_metadata(rows, self.kv_cache.page_size, self.device, sliding_window, trees=trees,
                              native_attention=self.native_attention)

    def planner_metadata(self, planner, seq_ids, starts, num_query, sliding_window: Optional[int] = None,
                         trees: Optional[List[Optional[TreeBlock]]] = None):
        """``metadata`` for rows of the planner's sequences, page tables read natively."""
        return planner_metadata(planner, seq_ids, starts, num_query, self.device, sliding_window, trees,
                                native_attention=self.native_attention)

    def forward_rows(self, rows: List[Tuple[int, List[int], List[int]]], sliding_window: Optional[int] = None,
                     features: Optional[torch.Tensor] = None, trees: Optional[List[Optional[TreeBlock]]] = None,
                     all_tokens: bool = False):
        """One forward over (start position, token ids, page table) rows -> logits at each
        row's last token, or at every token with ``all_tokens`` (and, with ``features``, the
        model's outputs there too). ``trees``: per row, a ``TreeBlock`` or None (causal)."""
        if not all_tokens and (trees is None or all(t is None for t in trees)):
            out = self._native_rows(rows, sliding_window, features)
            if out is not None:
                return out if features is not None else out[0]
        ids, meta_rows, last = [], [], []
        for start, toks, table in rows:
            ids.extend(toks)
            meta_rows.append((start, len(toks), table))
            last.extend(range(len(ids) - len(toks), len(ids)) if all_tokens else [len(ids) - 1])
        meta, positions = self.metadata(meta_rows, sliding_window, trees)
        ids_t, last_t = to_device([np.asarray(ids, dtype=np.int64), np.asarray(last, dtype=np.int64)], self.device)
        return self.forward(ids_t, positions, meta, last_t,
                            hidden_indices=None if features is None else last_t, features=features)

    def _native_inputs(self, rows):
        """(stack, (embed, lm_head rows), row token ids or None, block table, token ids,
        starts, lengths) for re-running rows natively (``ops.stack_drafting``) when the
        model runs as a stack and the rows are a small step; else None."""
        full = self.model.drafting_io() if self.device.type == "cpu" and self.graphs is None else None
        io, row_ids = (None, None) if full is None else (full[:2], full[2])
        num_tokens = sum(len(toks) for _, toks, _ in rows)
        stack = self.stack() if io is not None and num_tokens <= NATIVE_ATTENTION_MAX_TOKENS else None
        if stack is None or not fits(stack, io[1], len(rows), num_tokens):
            return None
        table = block_table([t for *_, t in rows])
        packed = [tok for _, toks, _ in rows for tok in toks]    # tokens, then starts, then lengths
        packed += [start for start, _, _ in rows] + [len(toks) for _, toks, _ in rows]
        packed = torch.from_numpy(np.asarray(packed, dtype=np.int64))
        return stack, io, row_ids, table, packed[:num_tokens], packed[num_tokens:-len(rows)], packed[-len(rows):]

    def _native_rows(self, rows, sliding_window, features):
        """``forward_rows`` (logits, outputs) as one native call; None where it does not apply."""
        inputs = self._native_inputs(rows)
        if inputs is None:
            return None
        stack, io, row_ids, table, ids, starts, lens = inputs
        self.policy.record("native_stack")
        with torch.inference_mode(), self.threads.native():
            logits, outs = rows_forward(stack, *io, ids, starts, lens, table, self.kv_cache.page_size, sliding_window,
                                        None if features is None else features.to(torch.float32), row_ids)
        return vocab_logits(logits, row_ids, self.model.vocab_size), outs

    def decode_rows(self, rows: List[Tuple[int, List[int], List[int]]], sliding_window: Optional[int]):
        """A step of decoding rows - (start, the sequence's last token and its drafts, page
        table) - as one native call (embedding, stack and lm_head, the kernels ``forward``
        runs, so the same bits): (float32 logits, final hidden states, each logits row's top
        token) at every token in packed order (``ops.stack_drafting.decode_rows_forward``),
        or None where the call does not apply (not a CPU stack step, layers captured for a
        drafter's fused features, ``policy.decode_rows`` off). Spares a decode step the
        per-op bookkeeping in Python, which costs most after the weights have streamed
        through the caches. Runs inside the engine step's native-threads context."""
        if (self.capture or not self.policy.decode_rows or not self.native_attention or self.device.type != "cpu"
                or self.graphs is not None):
            return None
        embed, lm_head, row_ids = self.model.drafting_io()
        num_tokens = sum(len(toks) for _, toks, _ in rows)
        stack = self.stack() if row_ids is None and num_tokens <= NATIVE_ATTENTION_MAX_TOKENS else None
        if stack is None or not fits(stack, lm_head, num_tokens, num_tokens):
            return None
        self.policy.record("native_stack")
        return decode_rows_forward(stack, embed, lm_head, rows, self.kv_cache.page_size, sliding_window)

    def refill_chain(self, rows: List[Tuple[int, List[int], List[int]]], sliding_window: Optional[int], vocab: int,
                     steps: int, features: Optional[torch.Tensor] = None, stop_below: Optional[float] = None,
                     sampling: Optional[Callable[[], tuple]] = None,
                     penalties: Optional[Callable[[torch.Tensor, int], Optional[tuple]]] = None):
        """A drafter's ``forward_rows`` over (start, token ids, page table) rows (an MTP
        head with ``features``), then per row its top token among the first ``vocab`` logits
        and ``steps`` chain rounds from it, in one native call: (logits over the lm_head rows
        ``model.drafting_io()[2]`` (None: all) and outputs at each row's last token, tokens
        (rows, 1 + steps), with ``stop_below`` their scores (rows, 1 + steps) and the chain
        stopped by it as ``spec.draft_stop`` describes, else None,
        with ``sampling`` the drafts' distributions (rows, 1 + steps, lm_head rows), else
        None); None where it does not apply. ``sampling``: a function giving
        ``ops.stack_drafting.refill_chain``'s sampling arguments (the tokens then drawn),
        called only once the call applies - it draws the requests' uniforms. ``penalties``:
        a function of (row_ids, lm_head rows used) giving the call's ``penalties`` argument
        (or None)."""
        inputs = self._native_inputs(rows)
        if inputs is None:
            return None
        stack, io, row_ids, table, ids, starts, lens = inputs
        self.policy.record("native_stack")
        scores = None if stop_below is None else torch.empty(len(rows), steps + 1, dtype=torch.float32)
        used = min(vocab, io[1].shape[0])
        with torch.inference_mode(), self.threads.native():   # draft vocabulary ids ascending: ties as in argmax
            logits, outs, tokens, probs = refill_chain(stack, *io, used, ids, starts, lens,
                                                       table, self.kv_cache.page_size, sliding_window, steps,
                                                       None if features is None else features.to(torch.float32),
                                                       row_ids, scores=scores, stop_below=stop_below or 0.0,
                                                       sampling=None if sampling is None else sampling(),
                                                       penalties=None if penalties is None
                                                       else penalties(row_ids, used))
        return logits, outs, tokens, scores, probs

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: PagedAttentionMetadata,
                logits_indices: torch.Tensor, hidden_indices=None, features: Optional[torch.Tensor] = None):
        """Runs the packed tokens (num_tokens,) and returns float32 logits for the rows in
        ``logits_indices`` (num_logits, vocab_size), plus final hidden states for the rows in
        ``hidden_indices`` (an index tensor or slice) when given - fused with the captured
        layers' streams where ``fuse_layers`` set them. ``features`` (num_tokens,
        hidden_size) are the per-token hidden-state inputs of an MTP head."""
        graphed = (None if self.graphs is None or self.capture
                   else self.graphs.run(input_ids, positions, meta, logits_indices, features))
        if graphed is not None:   # a graph's static outputs: copied out before its next replay
            self.policy.record("cuda_graph")
            hidden, logits = graphed
            return logits.clone() if hidden_indices is None else (logits.clone(), hidden[hidden_indices].clone())
        path, stack = self.policy.choose(self, input_ids.numel(), meta)
        extra = () if features is None else (features,)
        capture = {"capture": self.capture} if self.capture else {}
        with self.threads.for_path(path):
            out = None if stack is None else run_native_stack(stack, self.model, input_ids, positions, meta,
                                                              features, self.capture)
            if out is None:
                out = self.model(input_ids, positions, TorchPagedAttention(self.kv_cache, meta), *extra, **capture)
            hidden, streams = out if self.capture else (out, None)
            logits = self.model.compute_logits(hidden[logits_indices])
        if hidden_indices is None:
            return logits
        if streams is None:
            return logits, hidden[hidden_indices]
        return logits, self._fuse(hidden[hidden_indices], streams[hidden_indices])
