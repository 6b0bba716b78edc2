"""Which GEMM a 16-bit CUDA linear layer runs: the CUTLASS 64-row-tile kernel or torch's
(cuBLAS), chosen per shape by timing both on the device at the shape's first use.

``SONARSPEC_CUDA_GEMM`` = ``auto`` (default: the faster, measured), ``cutlass`` or
``torch`` forces one (benchmarks). A shape first seen while a CUDA graph is being
captured takes torch's GEMM without timing (nothing may wait for the device there); the
engine's graphs run each shape eagerly before capturing it, so their shapes are timed.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, Tuple

import torch

from .cuda_events import median_event_ms

CHOICES = ("auto", "cutlass", "torch")
TUNE_MAX_ROWS = 256   # more rows: torch's GEMM (the CUTLASS kernel's 64-row tiles serve small steps)
_REPS = 10

_chosen: Dict[Tuple, str] = {}   # (rows, n, k, dtype, bias, device index) -> "cutlass" | "torch"


def forced() -> str:
    v = os.environ.get("SONARSPEC_CUDA_GEMM", "auto")
    if v not in CHOICES:
        raise ValueError(f"SONARSPEC_CUDA_GEMM must be one of {', '.join(CHOICES)}, got {v!r}")
    return v


def _median_ms(fn: Callable[[], object]) -> float:
    return median_event_ms(fn, _REPS)


def choose(key: Tuple, cutlass: Callable[[], object], torch_gemm: Callable[[], object]) -> str:
    """"cutlass" or "torch" for a GEMM of shape ``key`` (its first element the row count),
    timing ``cutlass`` and ``torch_gemm`` (each computes the layer's output) once per key."""
    mode = forced()
    if mode != "auto":
        return mode
    got = _chosen.get(key)
    if got is not None:
        return got
    if key[0] > TUNE_MAX_ROWS or torch.cuda.is_current_stream_capturing():
        return "torch"
    _chosen[key] = "cutlass" if _median_ms(cutlass) < _median_ms(torch_gemm) else "torch"
    return _chosen[key]


def chosen() -> Dict[Tuple, str]:
    """The choices made so far (for benchmarks' reports)."""
    return dict(_chosen)
