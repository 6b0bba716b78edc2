"""CUDA graphs for small uniform forwards: decoding, verification and draft rounds.

On a GPU the eager per-op forward of a small model is bound by the host launching its
kernels (hundreds per step) rather than by the device. A step whose sequences all have
the same number of query tokens (a decoding step, a chain verification, a draft round)
has a fixed shape apart from its context length, so it can run as a CUDA graph captured
once per (batch size, queries per sequence, key bucket): the step's inputs are copied
into the graph's static buffers and the graph replays every kernel in one launch. The
block table (for the attention kernel's key lists) or the gathered keys (for masked SDPA)
are padded to the bucket (a power of two), so one graph serves a range of context
lengths: key lists never reach the padding, and SDPA's padding is masked.

``StepGraphs(runner, capture=False)`` runs the same static-buffer forward eagerly: the
CPU tests check the buffers, padding and masks that way.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..layers.attention import PagedAttentionMetadata, TorchPagedAttention
from ..ops.limits import CUDA_GRAPH_MAX_TOKENS

MAX_GRAPHS = 128    # captured graphs per runner (batch sizes x query counts x key buckets); more run eagerly
MIN_KEYS = 64       # smallest key bucket
# masked attention inside a graph: backends whose kernels are captured without host work
_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def key_bucket(num_keys: int) -> int:
    """The padded key length of a graph: the next power of two from ``MIN_KEYS``."""
    return max(MIN_KEYS, 1 << (max(num_keys, 1) - 1).bit_length())


class _Graph:
    """Static inputs and outputs of one graphed shape, and its graph once captured."""

    def __init__(self, runner, batch: int, queries: int, keys: int, feature_dim: Optional[int], num_logits: int,
                 key_lists: int = 0):
        dev, n = runner.device, batch * queries
        self.runner = runner
        self.ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.logits_rows = torch.zeros(num_logits, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.features = None if feature_dim is None else torch.zeros(n, feature_dim, dtype=runner.dtype, device=dev)
        rows, page = torch.arange(n, device=dev), runner.kv_cache.page_size
        if key_lists:   # the attention kernel's per-token key lists over a table of `keys` positions
            native = tuple(torch.zeros(n, dtype=torch.long, device=dev) for _ in range(key_lists))
            table, kv_slots, mask = torch.zeros(batch, -(-keys // page), dtype=torch.long, device=dev), None, None
        else:           # SDPA over `keys` gathered slots, the padding masked
            native, table = None, torch.zeros(batch, 1, dtype=torch.long, device=dev)
            kv_slots = torch.zeros(batch, keys, dtype=torch.long, device=dev)
            mask = torch.zeros(batch, 1, queries, keys, dtype=torch.bool, device=dev)
        self.meta = PagedAttentionMetadata(
            slot_mapping=torch.full((n,), -1, dtype=torch.long, device=dev), query_index=rows.view(batch, queries),
            block_table=table, page_size=page, kv_slots=kv_slots, mask=mask, output_index=rows, uniform_queries=True,
            native=native)
        self.graph = None
        self.out: Optional[Tuple[torch.Tensor, torch.Tensor]] = None   # (hidden, logits) of the last run

    def fill(self, input_ids, positions, meta: PagedAttentionMetadata, logits_rows, features) -> None:
        m = self.meta
        self.ids.copy_(input_ids)
        self.logits_rows.copy_(logits_rows)
        self.positions.copy_(positions)
        m.slot_mapping.copy_(meta.slot_mapping)
        if m.native is not None:   # table columns past the step's are never read: key lists end before them
            m.block_table[:, :meta.block_table.shape[1]].copy_(meta.block_table)
            for static, t in zip(m.native, meta.native):
                static.copy_(t)
        else:
            n = meta.kv_slots.shape[1]
            m.kv_slots[:, :n].copy_(meta.kv_slots)       # slots past n keep old (valid) values: masked below
            if meta.mask is None:
                m.mask[..., :n].fill_(True)
            else:
                m.mask[..., :n].copy_(meta.mask)
            m.mask[..., n:].fill_(False)
        if features is not None:
            self.features.copy_(features)

    def forward(self) -> Tuple[torch.Tensor, torch.Tensor]:
        model = self.runner.model
        extra = () if self.features is None else (self.features,)
        with sdpa_kernel(_SDPA):
            hidden = model(self.ids, self.positions, TorchPagedAttention(self.runner.kv_cache, self.meta), *extra)
            return hidden, model.compute_logits(hidden[self.logits_rows])

    def capture(self, pool):
        """Captures ``forward`` after two warm-up runs on a side stream (the warm-ups compute
        this step for real; the KV they store is what the replay stores again)."""
        side = torch.cuda.Stream(self.runner.device)
        side.wait_stream(torch.cuda.current_stream(self.runner.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.forward()
        torch.cuda.current_stream(self.runner.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):   # the planner's thread runs on
            self.out = self.forward()
        self.graph = graph
        return graph.pool()


class StepGraphs:
    """The graphed forwards of one ``ModelRunner``; ``run`` returns None for steps it does
    not take (non-uniform steps, steps of more than ``max_tokens`` tokens, the first use of
    a shape, a shape past ``MAX_GRAPHS``, or after a capture failed), which then run
    eagerly."""

    def __init__(self, runner, capture: bool = True, max_tokens: int = CUDA_GRAPH_MAX_TOKENS):
        self.runner, self.capture, self.max_tokens = runner, capture, max_tokens
        self.graphs: Dict[tuple, _Graph] = {}
        self.seen: Dict[tuple, int] = {}   # uses of shapes without a graph yet
        self.pool = None
        self.error: Optional[str] = None   # why capturing stopped, if it did

    def run(self, input_ids, positions, meta: PagedAttentionMetadata, logits_rows: torch.Tensor, features=None
            ) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """(hidden states of every packed token, logits at ``logits_rows``), or None. The
        logits come from the same GEMM over the same rows as the eager path's."""
        key_lists = 0 if meta.native is None else len(meta.native)
        if (self.error is not None or not meta.uniform_queries or (meta.kv_slots is None and not key_lists)
                or not isinstance(logits_rows, torch.Tensor)):
            return None
        batch, queries = meta.query_index.shape
        if batch * queries > self.max_tokens or batch * queries != input_ids.numel():
            return None
        keys = key_bucket(meta.block_table.shape[1] * meta.page_size if key_lists else meta.kv_slots.shape[1])
        shape = (batch, queries, keys, None if features is None else features.shape[-1], logits_rows.numel(),
                 key_lists)
        g = self.graphs.get(shape)
        if g is None:   # a shape gets a graph at its second use: one-off shapes (a prompt's prefill) stay eager
            self.seen[shape] = self.seen.get(shape, 0) + 1
            if self.seen[shape] < 2 or len(self.graphs) >= MAX_GRAPHS:
                return None
            g = self.graphs[shape] = _Graph(self.runner, *shape)
        g.fill(input_ids, positions, meta, logits_rows, features)
        if not self.capture:
            return g.forward()
        if g.graph is None:
            try:
                self.pool = g.capture(self.pool)
            except Exception as e:   # a kernel that cannot be captured: this runner stays eager
                self.error = f"{type(e).__name__}: {e}"
                del self.graphs[shape]
                return None
        g.graph.replay()
        return g.out
