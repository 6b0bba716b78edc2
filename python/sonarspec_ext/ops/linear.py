"""``padded_linear``: ``F.linear`` whose cost stays flat for small token counts."""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Optional

import torch
import torch.nn.functional as F

from .. import _C

# Largest row count sent to the native small-M kernel on CPU: one pass over the weights
# serves up to 8 rows; beyond that torch's BLAS GEMM is as fast or faster.
SMALL_M_MAX_ROWS = 8

# Threads for the native kernel while ``native_gemm_threads`` is active (else torch's).
_native_threads: ContextVar[Optional[int]] = ContextVar("sonarspec_native_threads", default=None)


@contextmanager
def native_gemm_threads():
    """For a forward pass whose GEMMs all go to the native small-M kernel: the kernel
    keeps torch's thread count while torch's own (tiny) ops run single-threaded, so
    torch's spinning OpenMP workers do not take the cores the kernel's workers need."""
    n = torch.get_num_threads()
    token = _native_threads.set(n)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
        _native_threads.reset(token)


def native_threads() -> int:
    """Threads for a native CPU kernel: torch's count, also inside ``native_gemm_threads``."""
    return _native_threads.get() or torch.get_num_threads()


def uses_native_gemm(num_rows: int, device: torch.device, dtype: torch.dtype) -> bool:
    return 0 < num_rows <= SMALL_M_MAX_ROWS and device.type == "cpu" and dtype == torch.float32


def padded_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Same contract as ``torch.nn.functional.linear``: x (..., in_features), weight
    (out_features, in_features), bias (out_features,) -> (..., out_features).

    float32 CPU inputs with at most ``SMALL_M_MAX_ROWS`` rows and no autograd use the
    register-blocked native kernel; everything else goes to ``F.linear``."""
    rows = x.numel() // x.shape[-1] if x.dim() else 0
    if (uses_native_gemm(rows, x.device, x.dtype) and weight.dtype == torch.float32 and weight.dim() == 2
            and weight.shape[1] == x.shape[-1] and weight.is_contiguous() and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        xc = x.contiguous()
        out = torch.empty(*x.shape[:-1], weight.shape[0], dtype=torch.float32)
        _C.small_gemm(xc.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                      rows, weight.shape[0], weight.shape[1], native_threads())
        return out
    return F.linear(x, weight, bias)
