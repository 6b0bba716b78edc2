"""A loaded model's weights moved into one contiguous buffer on huge pages
(``ops.host_memory``), in the order a forward reads them: a decode step then streams its
weights as one run of 2 MiB pages instead of hundreds of separate allocations (SmolLM2's
Q4_1 decode forward took 0.85-0.95x the time on an AMD Zen 4 VM, docs/quantization.md).

Every tensor keeps its identity: its ``.data`` is pointed at the arena with the same
shape, strides and offset within what was its storage, so tied weights, fused
projections and their row views stay shared. Run it before anything records raw
pointers to the weights (the native decoder stack reads them when it is built)."""
from __future__ import annotations

from typing import Iterable, List, Tuple

import torch
from torch import nn

from ..ops.host_memory import huge_page_empty, return_freed_memory
from ..ops.quantized import QuantizedMatrix

_ALIGN = 64
_TRIM_EVERY = 64 << 20   # bytes moved between returns of the freed heap to the system


def _weights(value) -> Iterable:
    """The weights in an attribute: a parameter, a QuantizedMatrix, a float tensor, or those in
    a tuple (fused operands) - not index tensors (a draft vocabulary)."""
    if isinstance(value, QuantizedMatrix) or (
            isinstance(value, torch.Tensor) and (isinstance(value, nn.Parameter) or value.is_floating_point())):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            if isinstance(v, (torch.Tensor, QuantizedMatrix)):
                yield from _weights(v)


def _backing(w) -> torch.Tensor:
    """The tensor holding a weight: itself, or a QuantizedMatrix's packed bytes."""
    return w.data if isinstance(w, QuantizedMatrix) else w


def _tensors(value) -> Iterable[torch.Tensor]:
    """The tensors holding an attribute's weights."""
    return map(_backing, _weights(value))


def module_weights(model: nn.Module) -> Iterable[Tuple[nn.Module, object]]:
    """(module, weight) for each weight each module of ``model`` holds - parameters,
    block-format matrices, fused operands kept as plain attributes - tensors or
    QuantizedMatrix objects, possibly several views of the same memory."""
    for module in model.modules():
        for value in list(module._parameters.values()) + list(vars(module).values()):
            for w in _weights(value):
                yield module, w


def weight_tensors(model: nn.Module) -> List[torch.Tensor]:
    """The tensors holding the model's weights, each once, in module order."""
    seen, out = set(), []
    for _, w in module_weights(model):
        t = _backing(w)
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def tensor_span(t) -> Tuple[int, int]:
    """[first byte, past the last byte) of the memory a tensor (a QuantizedMatrix: its packed
    bytes) reaches."""
    t = _backing(t)
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    reach = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + reach * t.element_size()


def union_bytes(spans: Iterable[Tuple[int, int]]) -> int:
    """Bytes covered by byte ranges, overlaps counted once (fused weights and their views)."""
    total, end = 0, None
    for a, b in sorted(spans):
        if end is None or a >= end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


def pack_weights(model: nn.Module, keep: Iterable = ()) -> int:
    """Moves the storages of ``model``'s CPU weights into one huge-page buffer, except those
    of ``keep`` (weights another model owns, e.g. a shared embedding). Returns the bytes moved."""
    kept = {t.untyped_storage().data_ptr() for k in keep for t in _tensors(k)}
    tensors = [t for t in weight_tensors(model) if t.device.type == "cpu" and t.numel() > 0
               and t.untyped_storage().data_ptr() not in kept]
    groups, total = {}, 0   # storage -> (its offset in the arena, the tensors on it)
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if key not in groups:
            groups[key] = (total, [])
            total += -(-t.untyped_storage().nbytes() // _ALIGN) * _ALIGN
        groups[key][1].append(t)
    if total == 0:
        return 0
    arena = huge_page_empty(total)   # untouched: its pages come as storages are copied in
    freed = 0
    with torch.no_grad():
        for start, group in groups.values():
            s = group[0].untyped_storage()
            n = s.nbytes()
            arena[start:start + n].copy_(torch.empty(0, dtype=torch.uint8).set_(s))
            del s
            for t in group:   # the old storage is freed once its last tensor moves: one extra at a time
                base = arena[start:start + n].view(t.dtype)
                t.data = base.as_strided(t.shape, t.stride(), base.storage_offset() + t.storage_offset())
            freed += n
            if freed >= _TRIM_EVERY:   # small storages were heap blocks: give them back as we go
                return_freed_memory(collect=False)
                freed = 0
    return total
