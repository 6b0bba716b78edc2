"""``kernel_linear`` and ``kernel_mlp``: ``F.linear`` and the gated MLP through the engine's own kernels
(native small-M GEMMs on the CPU, CUTLASS 64-row tiles on CUDA) where they apply, so their cost stays
flat for small token counts."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import torch
import torch.nn.functional as F

from .. import _C
from . import cuda_gemm_choice
from .checks import DTYPE_CODES, built_with_cutlass, stream_handle
from .elementwise import silu_and_mul
from .limits import COMPACT_MAX_ROWS, NATIVE_MAX_ROWS, SMALL_M_MAX_ROWS
from .quantized import QuantizedMatrix, weight_format_code


# The native kernels' thread count while ``native_gemm_threads`` is active (None: torch's).
# Process-wide, as torch's own count is: one engine runs at a time (the LLM facade's lock).
_native_count: Optional[int] = None


@contextmanager
def native_gemm_threads(num_threads: Optional[int] = None):
    """For work whose heavy parts are native kernels (a small forward pass, a whole engine
    step): the kernels get ``num_threads`` (default: torch's count) while torch's own (tiny)
    ops run single-threaded, so torch's OpenMP workers - which keep spinning on the cores
    after a parallel region - do not take the cores the kernels' workers need. Re-entrant:
    inside another, the outer count stays. Both counts are restored on exit."""
    global _native_count
    prev_native, prev_torch = _native_count, torch.get_num_threads()
    _native_count = prev_native or num_threads or prev_torch
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev_torch)
        _native_count = prev_native


@contextmanager
def torch_gemm_threads():
    """For work on torch's kernels (a large prefill chunk) inside ``native_gemm_threads``:
    torch gets the native thread count back meanwhile."""
    prev = torch.get_num_threads()
    torch.set_num_threads(native_threads())
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def native_threads() -> int:
    """Threads for a native CPU kernel: the count ``native_gemm_threads`` set, else torch's."""
    return _native_count or torch.get_num_threads()


def uses_native_gemm(num_rows: int, device: torch.device, dtype: torch.dtype, compact: bool = False) -> bool:
    """Whether a float32 GEMM of ``num_rows`` rows goes to the native kernel (``compact``:
    the weights are bfloat16)."""
    limit = COMPACT_MAX_ROWS if compact else SMALL_M_MAX_ROWS
    return 0 < num_rows <= limit and device.type == "cpu" and dtype == torch.float32


def kernel_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Same contract as ``torch.nn.functional.linear``: x (..., in_features), weight
    (out_features, in_features), bias (out_features,) -> (..., out_features).

    float32 CPU inputs with few rows and no autograd use the register-blocked native kernel
    (float32 weights: up to ``SMALL_M_MAX_ROWS`` rows; bfloat16 weights: up to
    ``COMPACT_MAX_ROWS``; under ``torch.inference_mode``, any number of rows);
    bfloat16/float16 CUDA tensors use the CUTLASS GEMM with 64-row tiles when the build
    has it (in_features and out_features multiples of 8); everything
    else goes to ``F.linear``. bfloat16 weights with float32 activations always compute
    as the native kernel does: activations rounded to bfloat16, products summed in
    float32 (``F.linear`` on the widened operands beyond the native row counts). A bias
    that is not (out_features,) broadcasts (or fails) as ``F.linear`` decides."""
    rows = x.numel() // x.shape[-1] if x.dim() else 0
    if isinstance(weight, QuantizedMatrix):
        return _quantized_linear(x, weight, bias, rows)
    compact = weight.dtype == torch.bfloat16
    # inference runs every row count natively: each row's result is the one it gets alone
    # (F.linear rounds large batches differently), so a batch never changes a request's tokens
    native_rows = uses_native_gemm(rows, x.device, x.dtype, compact) or (
        rows > 0 and torch.is_inference_mode_enabled() and uses_native_gemm(1, x.device, x.dtype, compact))
    if (native_rows and weight.dtype in (torch.float32, torch.bfloat16)
            and weight.dim() == 2 and weight.shape[1] == x.shape[-1] and weight.is_contiguous()
            and weight.device == x.device
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous() and bias.device == x.device
                                  and tuple(bias.shape) == (weight.shape[0],)))
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        xc = x.contiguous()
        out = torch.empty(*x.shape[:-1], weight.shape[0], dtype=torch.float32)
        _C.small_gemm(xc.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                      rows, weight.shape[0], weight.shape[1], native_threads(), weight_format_code(weight))
        return out
    if x.device.type == "cuda" and built_with_cutlass():
        out = _cutlass_linear(x, weight, bias)
        if out is not None:
            return out
    if weight.dtype == torch.bfloat16 and x.dtype == torch.float32:
        x = x.bfloat16().float()   # the native kernel's arithmetic: bfloat16 inputs, float32 sums
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
    return F.linear(x, weight, bias)


def _quantized_linear(x: torch.Tensor, weight: QuantizedMatrix, bias: Optional[torch.Tensor],
                      rows: int) -> torch.Tensor:
    """``kernel_linear`` for block-quantized weights: the native GEMM for float32 CPU
    activations without autograd, any number of rows (each row's result is the one it
    gets alone); with autograd, F.linear on the dequantized matrix (frozen weights)."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the {weight.format} matrix takes {k}")
    if x.device.type != "cpu":
        raise ValueError(f"{weight.format} weights run on the CPU, got activations on {x.device}")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (n,) or bias.device.type != "cpu"):
        raise ValueError(f"the bias of a {weight.format} matrix must be float32 of shape [{n}] on the CPU")
    if torch.is_grad_enabled() and x.requires_grad:
        return F.linear(x, weight.dequantize().to(x.dtype), None if bias is None else bias.to(x.dtype))
    xc = x.float().contiguous()
    out = torch.empty(*x.shape[:-1], n, dtype=torch.float32)
    if rows:
        _C.small_gemm(xc.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.contiguous().data_ptr(),
                      out.data_ptr(), rows, n, k, native_threads(), weight.code)
    return out


_DTYPE_CODES = {d: DTYPE_CODES[d] for d in (torch.float16, torch.bfloat16)}   # the CUTLASS GEMM's


def _cutlass_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The CUTLASS 64-row-tile GEMM for 16-bit CUDA tensors without autograd, or None
    where it does not apply (other dtypes, shapes it does not take) or where torch's GEMM
    measured faster for the shape (``ops.cuda_gemm_choice``)."""
    if (x.dtype not in _DTYPE_CODES or weight.dtype != x.dtype or weight.dim() != 2 or weight.shape[1] != x.shape[-1]
            or weight.device != x.device or not weight.is_contiguous()
            or (bias is not None and (bias.dtype != x.dtype or not bias.is_contiguous() or bias.device != x.device))
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                             or (bias is not None and bias.requires_grad)))):
        return None
    n, k = weight.shape
    rows = x.numel() // k if k else 0
    if rows == 0:
        return None
    xc = x.reshape(rows, k).contiguous()

    def cutlass():
        out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
        status = _C.padded_gemm_cuda(xc.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
                                     out.data_ptr(), rows, n, k, _DTYPE_CODES[x.dtype], stream_handle(x.device))
        return None if status != 0 else out
    key = (rows, n, k, x.dtype, bias is not None, x.device.index)
    if cuda_gemm_choice.choose(key, cutlass, lambda: F.linear(xc, weight, bias)) != "cutlass":
        return None
    out = cutlass()
    return None if out is None else out.view(*x.shape[:-1], n)


def kernel_mlp(x: torch.Tensor, gate_up_weight: torch.Tensor, down_weight: torch.Tensor) -> torch.Tensor:
    """Gated SiLU MLP, ``down(silu(x @ gate^T) * (x @ up^T))``: ``gate_up_weight``
    (2 * intermediate, hidden) stacks the gate rows over the up rows, ``down_weight``
    (hidden, intermediate), x (..., hidden) -> (..., hidden); each weight a float32 or
    bfloat16 tensor or a ``QuantizedMatrix``, in its own format.

    float32 CPU inputs with few rows (as ``kernel_linear``) run as one native call; the
    result equals ``kernel_linear``, ``silu_and_mul``, ``kernel_linear`` in turn bit for
    bit, which is what every other case runs."""
    weights = (gate_up_weight, down_weight)
    for name, w in zip(("gate_up_weight", "down_weight"), weights):
        if not (isinstance(w, QuantizedMatrix) or isinstance(w, torch.Tensor) and w.dim() == 2):
            raise ValueError(f"{name} must be a 2-D tensor or a quantized matrix")
    H, inter = down_weight.shape
    if gate_up_weight.shape != (2 * inter, H):
        raise ValueError(f"gate_up_weight has shape {list(gate_up_weight.shape)}, expected [{2 * inter}, {H}] "
                         f"for down_weight of shape {list(down_weight.shape)}")
    if x.shape[-1] != H:
        raise ValueError(f"x has {x.shape[-1]} features, the MLP takes {H}")
    rows = x.numel() // H
    tensors = [w for w in weights if not isinstance(w, QuantizedMatrix)]
    if len(tensors) == 2 and gate_up_weight.dtype != down_weight.dtype:
        raise ValueError(f"gate_up_weight ({gate_up_weight.dtype}) and down_weight ({down_weight.dtype}) "
                         f"must share a dtype")
    if (0 < rows <= NATIVE_MAX_ROWS and x.device.type == "cpu" and x.dtype == torch.float32
            and all(w.dtype in (torch.float32, torch.bfloat16) and w.is_contiguous() and w.device == x.device
                    and uses_native_gemm(rows, x.device, x.dtype, w.dtype == torch.bfloat16) for w in tensors)
            and not (torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in tensors)))):
        return _native_mlp(x, gate_up_weight, down_weight, rows, H, inter)
    return kernel_linear(silu_and_mul(kernel_linear(x, gate_up_weight)), down_weight)


def _native_mlp(x, gate_up_weight, down_weight, rows: int, H: int, inter: int) -> torch.Tensor:
    xc = x.contiguous()
    out = torch.empty(*x.shape[:-1], H, dtype=torch.float32)
    _C.small_mlp(xc.data_ptr(), gate_up_weight.data_ptr(), weight_format_code(gate_up_weight), down_weight.data_ptr(),
                 weight_format_code(down_weight), out.data_ptr(), rows, H, inter, native_threads())
    return out
