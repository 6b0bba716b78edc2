"""The GGUF container (llama.cpp's file format, version 2 and 3): metadata fields and the
tensor index, parsed directly from the mapped file.

``gguf.GGUFReader`` builds a NumPy view per value, which for the vocabulary of a 49K-token
model (its tokens and merges: ~98K strings) takes seconds; this reads the same layout with
``struct`` in a fraction of that. Tensor data are read-only NumPy views of the mapping,
typed and shaped as ``gguf.GGUFReader`` gives them (float types as floats, quantized
types as bytes per row), and ``gguf`` still supplies the type constants and dequantizers.
Any inconsistency (a truncated file, an unknown value or tensor type, a tensor past the
end) is a ``ValueError`` that says what is wrong.
"""
from __future__ import annotations

import math
import struct
from typing import Dict, List, NamedTuple, Tuple

import numpy as np

# GGUF value types -> struct format (8: string, 9: array)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAX_NESTING = 8   # arrays of arrays: deeper is a corrupt file, not a recursion error


class GGUFTensor(NamedTuple):
    name: str
    shape: np.ndarray        # dimensions, fastest first (as stored)
    tensor_type: object      # gguf.GGMLQuantizationType
    n_elements: int
    n_bytes: int
    data_offset: int         # from the start of the file
    data: np.ndarray         # read-only view of the mapped file


class GGUFFile:
    """One GGUF file: ``fields`` (key -> Python value: numbers, strings, lists), ``tensors``
    (in file order) and ``data`` (the whole file, mapped read-only)."""

    def __init__(self, path: str):
        self.path = path
        self.data = np.memmap(path, mode="r", dtype=np.uint8)
        self._buf = memoryview(self.data)
        self._end = len(self.data)
        if self._end < 24 or bytes(self._buf[:4]) != b"GGUF":
            raise ValueError("no GGUF header (the file starts without the 'GGUF' magic or is shorter than it)")
        (version,) = struct.unpack_from("<I", self._buf, 4)
        self._order = "<" if version & 0xFFFF else ">"   # a big-endian file reads as a huge version
        if self._order == ">":
            (version,) = struct.unpack_from(">I", self._buf, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
        n_tensors, n_fields = self._unpack("QQ", 8)
        self._pos = 24
        self.fields: Dict[str, object] = {}
        for _ in range(n_fields):
            key = self._string()
            (vtype,) = self._take("I")
            self.fields[key] = self._value(vtype)
        index = [self._tensor_info() for _ in range(n_tensors)]
        alignment = self.fields.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment < 1:
            raise ValueError(f"general.alignment is {alignment!r}, not a positive integer")
        start = -(-self._pos // alignment) * alignment
        self.tensors: List[GGUFTensor] = [self._tensor(start, *info) for info in index]

    # -- the byte stream ---------------------------------------------------------------
    def _unpack(self, fmt: str, pos: int) -> Tuple:
        size = struct.calcsize(self._order + fmt)
        if pos + size > self._end:
            raise ValueError(f"the file ends at byte {self._end} inside its metadata (truncated)")
        return struct.unpack_from(self._order + fmt, self._buf, pos)

    def _take(self, fmt: str) -> Tuple:
        values = self._unpack(fmt, self._pos)
        self._pos += struct.calcsize(self._order + fmt)
        return values

    def _string(self) -> str:
        return self._strings(1)[0]

    def _strings(self, n: int) -> List[str]:
        """The next ``n`` strings (a vocabulary's: one tight loop)."""
        length = struct.Struct(self._order + "Q").unpack_from
        buf, pos, end, out = self._buf, self._pos, self._end, []
        for _ in range(n):
            if pos + 8 > end:
                raise ValueError(f"the file ends at byte {end} inside a string's length (truncated)")
            (k,) = length(buf, pos)
            pos += 8
            if pos + k > end:
                raise ValueError(f"a {k}-byte string at byte {pos} runs past the end of the file (truncated)")
            out.append(str(buf[pos:pos + k], "utf-8"))
            pos += k
        self._pos = pos
        return out

    def _value(self, vtype: int, depth: int = 0):
        if vtype in _SCALARS:
            return self._take(_SCALARS[vtype])[0]
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            etype, n = self._take("IQ")
            if etype in _SCALARS and etype != 7:   # numbers: one NumPy read
                dt = np.dtype(_SCALARS[etype]).newbyteorder(self._order)
                if self._pos + n * dt.itemsize > self._end:
                    raise ValueError(f"an array of {n} values at byte {self._pos} runs past the end of the file "
                                     f"(truncated)")
                values = np.frombuffer(self._buf, dt, count=n, offset=self._pos).tolist()
                self._pos += n * dt.itemsize
                return values
            if etype == _STRING:
                return self._strings(n)
            if depth >= _MAX_NESTING:
                raise ValueError(f"arrays nested more than {_MAX_NESTING} deep at byte {self._pos} (corrupt?)")
            return [self._value(etype, depth + 1) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {vtype} at byte {self._pos - 4}")

    # -- tensors -------------------------------------------------------------------------
    def _tensor_info(self):
        name = self._string()
        (n_dims,) = self._take("I")
        if n_dims > 8:
            raise ValueError(f"tensor {name!r} has {n_dims} dimensions (corrupt index?)")
        dims = self._take("Q" * n_dims)
        ttype, offset = self._take("IQ")
        return name, dims, ttype, offset

    def _tensor(self, start: int, name: str, dims: Tuple[int, ...], ttype: int, offset: int) -> GGUFTensor:
        import gguf
        try:
            qtype = gguf.GGMLQuantizationType(ttype)
            block, type_bytes = gguf.GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ValueError(f"tensor {name!r} has unknown type {ttype}") from None
        n_elements = math.prod(dims)   # exact: no 64-bit overflow from a corrupt index
        n_bytes = n_elements * type_bytes // block
        shape = tuple(int(d) for d in reversed(dims))   # slowest first, as NumPy indexes
        plain = {qtype.F16: np.float16, qtype.F32: np.float32, qtype.F64: np.float64, qtype.I8: np.int8,
                 qtype.I16: np.int16, qtype.I32: np.int32, qtype.I64: np.int64}
        if qtype in plain:
            dtype, count = np.dtype(plain[qtype]).newbyteorder(self._order), n_elements
        else:   # blocks: bytes per row
            if shape and shape[-1] % block:
                raise ValueError(f"tensor {name!r} of type {qtype.name} has rows of {shape[-1]} values, not a "
                                 f"multiple of its {block}-value blocks")
            dtype, count = np.dtype(np.uint8), n_bytes
            shape = (*shape[:-1], shape[-1] // block * type_bytes) if shape else (n_bytes,)
        at = start + offset
        if at + n_bytes > self._end:
            raise ValueError(f"tensor {name!r} needs {n_bytes} bytes at byte {at} but the file holds "
                             f"{max(0, self._end - at)}: the file is truncated")
        data = np.frombuffer(self._buf, dtype, count=count, offset=at).reshape(shape)
        return GGUFTensor(name, np.array(dims, dtype=np.uint64), qtype, n_elements, n_bytes, at, data)
