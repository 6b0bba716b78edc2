"""Block-quantized weight matrices: GGUF's Q8_0, Q4_0 and Q4_1 kept in their block formats
and repacked into the layout the native GEMM reads (``csrc/include/sonarspec/quant_gemm.h``).

A ``QuantizedMatrix`` stands where a linear layer's (out_features, in_features) weight
tensor would: ``ops.linear.kernel_linear`` and ``kernel_mlp``, the decoder stack and the
drafting kernels take it in place of a float32 or bfloat16 matrix. Repacking is a byte
permutation (``to_blocks`` gives the GGUF blocks back exactly), so ``dequantize`` is
``gguf``'s own dequantizer applied to the file's bytes.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from .. import _C

# format -> (native WeightFormat code, GGUF type name, bytes of one GGUF block of 32, header bytes)
_FORMATS = {"q8_0": (2, "Q8_0", 34, 2), "q4_0": (3, "Q4_0", 18, 2), "q4_1": (4, "Q4_1", 20, 4)}
QUANTIZED_FORMATS = tuple(_FORMATS)
# sonarspec::WeightFormat codes of float matrices
FLOAT_FORMAT_CODES = {torch.float32: 0, torch.bfloat16: 1}


def _gguf_type(fmt: str):
    import gguf
    return gguf.GGMLQuantizationType[_FORMATS[fmt][1]]


def format_of_gguf_type(type_name: str):
    """The format that keeps a GGUF tensor type as it is, or None (not run natively)."""
    return next((f for f, spec in _FORMATS.items() if spec[1] == type_name), None)


class QuantizedMatrix:
    """An (n, k) weight matrix in one of ``QUANTIZED_FORMATS``, packed for the native GEMM
    (CPU memory, ``data`` uint8). Inference only: no autograd, no device moves."""

    def __init__(self, data: torch.Tensor, fmt: str, shape: Sequence[int]):
        if fmt not in _FORMATS:
            raise ValueError(f"unknown quantized format {fmt!r}; supported: {', '.join(QUANTIZED_FORMATS)}")
        n, k = (int(d) for d in shape)
        if n < 1 or k < 32 or k % 32:
            raise ValueError(f"a {fmt} matrix needs at least one row and in_features a multiple of 32, "
                             f"got shape [{n}, {k}]")
        want = _C.quant_packed_bytes(_FORMATS[fmt][0], n, k)
        if data.dtype != torch.uint8 or data.dim() != 1 or data.numel() != want or not data.is_contiguous():
            raise ValueError(f"packed {fmt} data of a [{n}, {k}] matrix must be {want} contiguous uint8 bytes")
        self.data, self.format, self.shape = data, fmt, torch.Size((n, k))
        self.code = _FORMATS[fmt][0]
        self.device = data.device

    def __repr__(self) -> str:
        return f"QuantizedMatrix({self.format}, shape={list(self.shape)})"

    def data_ptr(self) -> int:
        return self.data.data_ptr()

    @property
    def nbytes(self) -> int:
        """Bytes streamed by one pass over the matrix (its packed size)."""
        return self.data.numel()

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_blocks(cls, blocks: np.ndarray, fmt: str, k: int) -> "QuantizedMatrix":
        """From GGUF blocks: (n, k // 32 * block bytes) uint8, each row's blocks in order."""
        _, _, bpb, hdr = _FORMATS[fmt]
        n, kb = blocks.shape[0], k // 32
        if k % 32 or blocks.dtype != np.uint8 or blocks.shape[1:] != (kb * bpb,):
            raise ValueError(f"{fmt} blocks of a matrix with {k} columns must be uint8 of shape "
                             f"[rows, {kb * bpb}], got {blocks.dtype} {list(blocks.shape)}")
        g = -(-n // 16)
        b = np.zeros((g * 16, kb, bpb), dtype=np.uint8)
        b[:n] = blocks.reshape(n, kb, bpb)
        b = b.reshape(g, 16, kb, bpb)
        parts = [b[..., h:h + 2].transpose(0, 2, 1, 3).reshape(g, kb, 32) for h in range(0, hdr, 2)]
        qs = b[..., hdr:]
        if fmt == "q8_0":
            qs = qs ^ np.uint8(0x80)   # int8 q -> q + 128 as an unsigned byte
        chunks = qs.shape[-1] // 4
        parts.append(qs.reshape(g, 16, kb, chunks, 4).transpose(0, 2, 3, 1, 4).reshape(g, kb, chunks * 64))
        packed = np.ascontiguousarray(np.concatenate(parts, axis=-1)).reshape(-1)
        return cls(torch.from_numpy(packed), fmt, (n, k))

    @classmethod
    def quantize(cls, w: torch.Tensor, fmt: str) -> "QuantizedMatrix":
        """A float matrix (n, k) quantized with ``gguf``'s quantizer (llama.cpp's rounding)."""
        import gguf
        if fmt not in _FORMATS:
            raise ValueError(f"unknown quantized format {fmt!r}; supported: {', '.join(QUANTIZED_FORMATS)}")
        if w.dim() != 2 or w.shape[1] % 32:
            raise ValueError(f"{fmt} quantizes matrices whose in_features are a multiple of 32, "
                             f"got shape {list(w.shape)}")
        blocks = gguf.quantize(w.detach().float().cpu().numpy(), _gguf_type(fmt))
        return cls.from_blocks(np.ascontiguousarray(blocks), fmt, w.shape[1])

    # -- views back ------------------------------------------------------------------------
    def to_blocks(self) -> np.ndarray:
        """The GGUF blocks (n, k // 32 * block bytes) uint8, exactly as ``from_blocks`` got them."""
        _, _, bpb, hdr = _FORMATS[self.format]
        n, k = self.shape
        g, kb = -(-n // 16), k // 32
        p = self.data.numpy().reshape(g, kb, -1)
        heads = [p[..., 32 * i:32 * i + 32].reshape(g, kb, 16, 2).transpose(0, 2, 1, 3) for i in range(hdr // 2)]
        chunks = (bpb - hdr) // 4
        qs = p[..., 16 * hdr:].reshape(g, kb, chunks, 16, 4).transpose(0, 3, 1, 2, 4).reshape(g, 16, kb, chunks * 4)
        if self.format == "q8_0":
            qs = qs ^ np.uint8(0x80)
        b = np.concatenate(heads + [qs], axis=-1).reshape(g * 16, kb * bpb)
        return np.ascontiguousarray(b[:n])

    def dequantize(self) -> torch.Tensor:
        """The matrix as float32 (n, k), by ``gguf``'s dequantizer."""
        import gguf
        values = gguf.dequantize(self.to_blocks(), _gguf_type(self.format))
        return torch.from_numpy(np.array(values, dtype=np.float32).reshape(tuple(self.shape)))

    def select_rows(self, index: torch.Tensor) -> "QuantizedMatrix":
        """The rows ``index`` (int tensor) as a new matrix."""
        rows = index.detach().cpu().to(torch.long).numpy()
        if rows.size == 0 or rows.min() < 0 or rows.max() >= self.shape[0]:
            raise ValueError(f"row indices must be non-empty and lie in [0, {self.shape[0]})")
        return QuantizedMatrix.from_blocks(self.to_blocks()[rows], self.format, self.shape[1])

    def row_view(self, begin: int, end: int) -> Optional["QuantizedMatrix"]:
        """Rows [begin, end) as a view of the packed bytes, or None where they do not lie on
        16-row groups (end may be the last row)."""
        n, k = self.shape
        if not (begin % 16 == 0 and (end % 16 == 0 or end == n) and 0 <= begin < end <= n):
            return None
        group = self.data.numel() // -(-n // 16)
        return QuantizedMatrix(self.data[begin // 16 * group:-(-end // 16) * group], self.format, (end - begin, k))

    @staticmethod
    def cat(mats: Sequence["QuantizedMatrix"]) -> "QuantizedMatrix":
        """Row-wise concatenation of matrices of one format and width."""
        fmt, k = mats[0].format, mats[0].shape[1]
        if any(m.format != fmt or m.shape[1] != k for m in mats):
            raise ValueError("concatenated quantized matrices must share a format and in_features")
        n = sum(m.shape[0] for m in mats)
        if all(m.shape[0] % 16 == 0 for m in mats[:-1]):   # whole groups: the packed bytes concatenate
            return QuantizedMatrix(torch.cat([m.data for m in mats]), fmt, (n, k))
        return QuantizedMatrix.from_blocks(np.concatenate([m.to_blocks() for m in mats]), fmt, k)


def weight_format_code(w) -> int:
    """The native WeightFormat code of a weight matrix (float32, bfloat16 or quantized)."""
    if isinstance(w, QuantizedMatrix):
        return w.code
    code = FLOAT_FORMAT_CODES.get(getattr(w, "dtype", None))
    if code is None:
        raise ValueError(f"weights of dtype {getattr(w, 'dtype', type(w).__name__)} have no native format")
    return code


def rows_of(w, index: torch.Tensor):
    """Rows ``index`` of a weight matrix, tensor or quantized."""
    return w.select_rows(index) if isinstance(w, QuantizedMatrix) else w.detach()[index.to(w.device)].contiguous()


def float_weight(w) -> torch.Tensor:
    """A weight matrix as a float32 tensor (quantized ones dequantized)."""
    return w.dequantize() if isinstance(w, QuantizedMatrix) else w.detach().float()
