"""Thread policy: the threads a model runner's work gets.

torch's thread count is process-wide, and so is the native kernels' (``ops.linear``): a
``ThreadPolicy``, owned by the runner, sets both around the work it runs and restores them
after. Native-kernel work (small steps, drafting, whole engine steps) runs torch's own
ops single-threaded - its OpenMP workers keep spinning after a parallel region and would
take the cores the kernels' workers need - and steps on torch's kernels (large prefill
chunks) give torch the threads back. One engine runs at a time (the LLM facade holds a
lock), so the settings belong to it while it runs.
"""
from __future__ import annotations

from typing import Optional

from ..ops.linear import native_gemm_threads, torch_gemm_threads


class ThreadPolicy:
    def __init__(self, num_threads: Optional[int] = None):
        """``num_threads``: the native kernels' count (None: torch's at the time)."""
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ValueError(f"num_threads must be None or a positive integer, got {num_threads!r}")
        self.num_threads = num_threads

    def native(self):
        """Context for work on native kernels (re-entrant)."""
        return native_gemm_threads(self.num_threads)

    def torch_ops(self):
        """Context for a forward on torch's kernels, inside ``native``."""
        return torch_gemm_threads()

    def for_path(self, path: str):
        """The context for an ``ExecutionPolicy`` path."""
        return self.torch_ops() if path == "torch_ops" else self.native()
