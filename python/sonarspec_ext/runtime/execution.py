"""``ExecutionPolicy``: which way a model runner's forward runs, and how often each way ran.

- ``cuda_graph``: a small step whose sequences share a query count, replayed as a CUDA
  graph (``runtime.cuda_graphs``; engine option ``cuda_graphs``).
- ``native_stack``: a float32 CPU step (its metadata carries the native attention's key
  ranges, whatever its size): the model's layers as one native call (``ops.DecoderStack``),
  in slices of the stack's largest step; drafters' re-runs through ``ops.stack_drafting``
  (at most ``ops.limits.NATIVE_ATTENTION_MAX_TOKENS`` tokens) count here too.
- ``native_ops``: op by op with the kernels' threads, where the GEMMs run natively
  (``ops.linear.uses_native_gemm``: ``ops.limits`` row counts by weight type).
- ``torch_ops``: op by op on torch's kernels with torch's threads (large prefills, GPUs).

The limits live in ``ops/limits.py``; the counts appear in ``LLM.stats()["execution"]``.
Steps where every sequence decodes (its last token and a chain of drafts) take the native
stack as one call from token ids to logits (``ModelRunner.decode_rows``) unless
``decode_rows`` is False (the per-op bookkeeping around the stack instead: the same
results, for comparison).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..ops.linear import uses_native_gemm

PATHS = ("cuda_graph", "native_stack", "native_ops", "torch_ops")


class ExecutionPolicy:
    def __init__(self):
        self.counts = dict.fromkeys(PATHS, 0)
        self.decode_rows = True

    def record(self, path: str) -> None:
        self.counts[path] += 1

    def choose(self, runner, num_tokens: int, meta) -> Tuple[str, Optional[object]]:
        """(path, decoder stack or None) for an eager forward of ``num_tokens`` tokens with
        ``meta`` on ``runner`` (CUDA graphs are tried before, by the runner), counted."""
        native = meta.native is not None and runner.device.type == "cpu" and runner.dtype == torch.float32
        stack = runner.stack() if native else None
        if stack is not None:
            path = "native_stack"
        elif uses_native_gemm(num_tokens, runner.device, runner.dtype, runner.compact):
            path = "native_ops"
        else:
            path = "torch_ops"
        self.record(path)
        return path, stack
