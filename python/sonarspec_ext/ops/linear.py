"""``padded_linear``: ``F.linear`` whose cost stays flat for small token counts."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .. import _C

# Largest row count sent to the native small-M kernel on CPU; beyond it the BLAS GEMM
# (MKL/oneDNN) is as fast or faster (measured by tools/bench_small_gemm.py).
SMALL_M_MAX_ROWS = 8


def padded_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Same contract as ``torch.nn.functional.linear``: x (..., in_features), weight
    (out_features, in_features), bias (out_features,) -> (..., out_features).

    float32 CPU inputs with at most ``SMALL_M_MAX_ROWS`` rows and no autograd use the
    register-blocked native kernel; everything else goes to ``F.linear``."""
    rows = x.numel() // x.shape[-1] if x.dim() else 0
    if (0 < rows <= SMALL_M_MAX_ROWS and x.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and weight.dim() == 2 and weight.shape[1] == x.shape[-1]
            and weight.is_contiguous() and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        xc = x.contiguous()
        out = torch.empty(*x.shape[:-1], weight.shape[0], dtype=torch.float32)
        _C.small_gemm(xc.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                      rows, weight.shape[0], weight.shape[1], torch.get_num_threads())
        return out
    return F.linear(x, weight, bias)
