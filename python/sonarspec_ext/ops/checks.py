"""Tensor checks shared by the ops: raise ValueError naming the tensor."""
from __future__ import annotations

from typing import Iterable, Optional

import torch

from .. import _C



# sonarspec::DType codes of the native kernels.
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

def check_tensor(name: str, t, *, dtypes: Optional[Iterable[torch.dtype]] = None, ndim: Optional[int] = None,
                 device: Optional[torch.device] = None, contiguous: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on {t.device}: the native ops take CPU or CUDA tensors with storage")
    if dtypes is not None and t.dtype not in tuple(dtypes):
        raise ValueError(f"{name} has dtype {t.dtype}, expected one of {[str(d) for d in dtypes]}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {list(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_page_size(page_size) -> None:
    """A KV page size: a positive int (not a bool)."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive integer, got {page_size!r}")


def stream_handle(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


_BUILD = _C.build_info()   # read once: the checks run on every kernel call
_BUILT_WITH_CUDA, _BUILT_WITH_CUTLASS = bool(_BUILD["cuda"]), bool(_BUILD["cutlass"])


def built_with_cuda() -> bool:
    """Whether the native extension has its CUDA kernels."""
    return _BUILT_WITH_CUDA


def built_with_cutlass() -> bool:
    """Whether the native extension has the CUTLASS 64-row-tile GEMM (CUDA builds that
    found the CUTLASS headers)."""
    return _BUILT_WITH_CUTLASS


def check_cuda_build(op: str, device: torch.device) -> None:
    if device.type == "cuda" and not built_with_cuda():
        raise ValueError(f"{op} got CUDA tensors but sonarspec was built without CUDA")
