"""Block-quantized weight matrices: GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K kept in their block formats
and repacked into the layout the native GEMM reads (``csrc/include/sonarspec/quant_gemm.h``).

A ``QuantizedMatrix`` stands where a linear layer's (out_features, in_features) weight
tensor would: ``ops.linear.kernel_linear`` and ``kernel_mlp``, the decoder stack and the
drafting kernels take it in place of a float32 or bfloat16 matrix. Repacking is a byte
permutation (``to_blocks`` gives the GGUF blocks back exactly), so ``dequantize`` is
``gguf``'s own dequantizer applied to the file's bytes.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import _C

class _Spec(NamedTuple):
    """How a GGUF block type is packed (``csrc/include/sonarspec/quant_gemm.h``): each
    header field (offset, length) becomes runs of 2 bytes x 16 rows, each quant segment
    (offset, length, flipped) chunks of 4 bytes x 16 rows (Q8_0's int8 made unsigned)."""
    code: int          # the native WeightFormat
    gguf: str          # GGUF type name
    columns: int       # columns of one block
    block_bytes: int   # bytes of one GGUF block
    fields: Tuple[Tuple[int, int], ...]
    quants: Tuple[Tuple[int, int, bool], ...]


_FORMATS = {
    "q8_0": _Spec(2, "Q8_0", 32, 34, ((0, 2),), ((2, 32, True),)),
    "q4_0": _Spec(3, "Q4_0", 32, 18, ((0, 2),), ((2, 16, False),)),
    "q4_1": _Spec(4, "Q4_1", 32, 20, ((0, 4),), ((4, 16, False),)),
    "q5_0": _Spec(8, "Q5_0", 32, 22, ((0, 2), (2, 4)), ((6, 16, False),)),     # d, qh; qs
    "q5_1": _Spec(9, "Q5_1", 32, 24, ((0, 4), (4, 4)), ((8, 16, False),)),     # d, m, qh; qs
    "q4_k": _Spec(5, "Q4_K", 256, 144, ((0, 16),), ((16, 128, False),)),            # d, dmin, scales; qs
    "q5_k": _Spec(7, "Q5_K", 256, 176, ((0, 16),), ((48, 128, False), (16, 32, False))),  # d, dmin, scales; qs, qh
    "q6_k": _Spec(6, "Q6_K", 256, 210, ((208, 2), (192, 16)), ((0, 128, False), (128, 64, False))),  # d, scales; ql, qh
}
QUANTIZED_FORMATS = tuple(_FORMATS)
K_QUANTS = ("q4_k", "q5_k", "q6_k")   # no quantizer in gguf: only kept from files
QUANTIZABLE_FORMATS = tuple(f for f in QUANTIZED_FORMATS if f not in K_QUANTS)   # float matrices -> blocks
# sonarspec::WeightFormat codes of float matrices
FLOAT_FORMAT_CODES = {torch.float32: 0, torch.bfloat16: 1}


def _gguf_type(fmt: str):
    import gguf
    return gguf.GGMLQuantizationType[_FORMATS[fmt].gguf]


def format_of_gguf_type(type_name: str):
    """The format that keeps a GGUF tensor type as it is, or None (not run natively)."""
    return next((f for f, spec in _FORMATS.items() if spec.gguf == type_name), None)


def block_columns(fmt: str) -> int:
    """Columns of one block of ``fmt``: in_features must be a multiple of it."""
    return _FORMATS[fmt].columns


def runs_fast(fmt) -> bool:
    """Whether ``fmt`` (a format name; anything else: False) has SIMD loops on this CPU (``_C.quant_kernel()``: AVX-512 VNNI or
    AVX2 run every format; the portable loops are for correctness, not speed)."""
    return fmt in _FORMATS and _C.quant_kernel() != "portable"


class QuantizedMatrix:
    """An (n, k) weight matrix in one of ``QUANTIZED_FORMATS``, packed for the native GEMM
    (CPU memory, ``data`` uint8). Inference only: no autograd, no device moves."""

    def __init__(self, data: torch.Tensor, fmt: str, shape: Sequence[int]):
        if fmt not in _FORMATS:
            raise ValueError(f"unknown quantized format {fmt!r}; supported: {', '.join(QUANTIZED_FORMATS)}")
        n, k = (int(d) for d in shape)
        cols = _FORMATS[fmt].columns
        if n < 1 or k < cols or k % cols:
            raise ValueError(f"a {fmt} matrix needs at least one row and in_features a multiple of {cols}, "
                             f"got shape [{n}, {k}]")
        want = _C.quant_packed_bytes(_FORMATS[fmt].code, n, k)
        if data.dtype != torch.uint8 or data.dim() != 1 or data.numel() != want or not data.is_contiguous():
            raise ValueError(f"packed {fmt} data of a [{n}, {k}] matrix must be {want} contiguous uint8 bytes")
        self.data, self.format, self.shape = data, fmt, torch.Size((n, k))
        self.code = _FORMATS[fmt].code
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
        """From GGUF blocks: (n, k // block columns * block bytes) uint8, each row's blocks in order."""
        if fmt not in _FORMATS:
            raise ValueError(f"unknown quantized format {fmt!r}; supported: {', '.join(QUANTIZED_FORMATS)}")
        spec = _FORMATS[fmt]
        n, nb = blocks.shape[0], k // spec.columns
        if k % spec.columns or blocks.dtype != np.uint8 or blocks.shape[1:] != (nb * spec.block_bytes,):
            raise ValueError(f"{fmt} blocks of a matrix with {k} columns must be uint8 of shape "
                             f"[rows, {nb * spec.block_bytes}], got {blocks.dtype} {list(blocks.shape)}")
        g = -(-n // 16)
        b = np.zeros((g * 16, nb, spec.block_bytes), dtype=np.uint8)
        b[:n] = blocks.reshape(n, nb, spec.block_bytes)
        b = b.reshape(g, 16, nb, spec.block_bytes)
        parts = [b[..., h:h + 2].transpose(0, 2, 1, 3).reshape(g, nb, 32)
                 for off, length in spec.fields for h in range(off, off + length, 2)]
        for off, length, flipped in spec.quants:
            qs = b[..., off:off + length] ^ np.uint8(0x80 if flipped else 0)   # Q8_0: int8 q -> q + 128
            parts.append(qs.reshape(g, 16, nb, length // 4, 4).transpose(0, 2, 3, 1, 4).reshape(g, nb, length * 16))
        packed = np.ascontiguousarray(np.concatenate(parts, axis=-1)).reshape(-1)
        return cls(torch.from_numpy(packed), fmt, (n, k))

    @classmethod
    def quantize(cls, w: torch.Tensor, fmt: str) -> "QuantizedMatrix":
        """A float matrix (n, k) quantized with ``gguf``'s quantizer (llama.cpp's rounding)."""
        import gguf
        if fmt not in QUANTIZABLE_FORMATS:
            raise ValueError(f"cannot quantize to {fmt!r}; quantizable formats: {', '.join(QUANTIZABLE_FORMATS)} "
                             f"(K-quant matrices are kept from GGUF files as they are)")
        if w.dim() != 2 or w.shape[1] % 32:
            raise ValueError(f"{fmt} quantizes matrices whose in_features are a multiple of 32, "
                             f"got shape {list(w.shape)}")
        blocks = gguf.quantize(w.detach().float().cpu().numpy(), _gguf_type(fmt))
        return cls.from_blocks(np.ascontiguousarray(blocks), fmt, w.shape[1])

    # -- views back ------------------------------------------------------------------------
    def to_blocks(self) -> np.ndarray:
        """The GGUF blocks (n, k // block columns * block bytes) uint8, exactly as ``from_blocks`` got them."""
        spec = _FORMATS[self.format]
        n, k = self.shape
        g, nb = -(-n // 16), k // spec.columns
        p = self.data.numpy().reshape(g, nb, -1)
        b = np.empty((g, 16, nb, spec.block_bytes), dtype=np.uint8)
        at = 0
        for off, length in spec.fields:
            for h in range(off, off + length, 2):
                b[..., h:h + 2] = p[..., at:at + 32].reshape(g, nb, 16, 2).transpose(0, 2, 1, 3)
                at += 32
        for off, length, flipped in spec.quants:
            qs = p[..., at:at + 16 * length].reshape(g, nb, length // 4, 16, 4).transpose(0, 3, 1, 2, 4)
            b[..., off:off + length] = qs.reshape(g, 16, nb, length) ^ np.uint8(0x80 if flipped else 0)
            at += 16 * length
        return np.ascontiguousarray(b.reshape(g * 16, nb * spec.block_bytes)[:n])

    def dequantize(self) -> torch.Tensor:
        """The matrix as float32 (n, k), by ``gguf``'s dequantizer."""
        import gguf
        values = gguf.dequantize(self.to_blocks(), _gguf_type(self.format))
        return torch.from_numpy(np.array(values, dtype=np.float32).reshape(tuple(self.shape)))

    def dequantize_rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` (int tensor of any shape) as float32 (*index.shape, k), dequantized
        natively from the packed blocks - equal to ``gguf``'s dequantizer bit for bit - so an
        embedding kept in a block format needs no float copy. IndexError for a row outside
        [0, n)."""
        ids = index.detach().to(device="cpu", dtype=torch.int64).contiguous()
        n, k = self.shape
        out = torch.empty((*ids.shape, k), dtype=torch.float32)
        _C.embedding_rows(self.data_ptr(), self.code, n, k, ids.data_ptr(), ids.numel(), out.data_ptr())
        return out

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
