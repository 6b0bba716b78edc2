"""Device time of a CUDA call, by CUDA events: the median of ``reps`` timed calls after
``warmup`` untimed ones (the GEMM choice and the GPU benchmarks)."""
from __future__ import annotations

import statistics
from typing import Callable

import torch


def median_event_ms(fn: Callable[[], object], reps: int = 10, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)
