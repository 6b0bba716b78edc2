"""Host arrays to the device in one transfer.

A step's inputs and attention metadata are a handful of small host arrays. Copying each
with ``.to(device)`` costs one copy and one wait for the device per array (torch waits for
the stream after a copy from pageable memory). On CUDA they are packed into one pinned
buffer instead and copied without waiting; the tensors returned are views of that one
device buffer. torch's pinned-memory allocator keeps the buffer until the copy is done.
On the CPU the arrays are wrapped without copying.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch

_ALIGN = 8   # every array starts on an 8-byte boundary, so int64 views are aligned


def to_device(arrays: Sequence[Optional[np.ndarray]], device,
              pack: Optional[bool] = None) -> List[Optional[torch.Tensor]]:
    """Tensors on ``device`` with the contents, dtypes and shapes of ``arrays`` (None entries
    stay None). ``pack``: copy through one packed buffer (default: on CUDA devices; the CPU
    takes it only when asked, which the tests use)."""
    device = torch.device(device)
    if pack is None:
        pack = device.type == "cuda"
    if not pack:
        return [None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays]
    arrays = [None if a is None else np.ascontiguousarray(a) for a in arrays]
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        if a is not None:
            total += -(-a.nbytes // _ALIGN) * _ALIGN
    host = torch.empty(max(total, _ALIGN), dtype=torch.uint8, pin_memory=device.type == "cuda")
    flat = host.numpy()
    for a, off in zip(arrays, offsets):
        if a is not None and a.nbytes:
            flat[off:off + a.nbytes] = a.reshape(-1).view(np.uint8)
    dev = host.to(device, non_blocking=True)
    out = []
    for a, off in zip(arrays, offsets):
        if a is None:
            out.append(None)
            continue
        dtype = torch.from_numpy(a[:0].reshape(-1)).dtype
        out.append(dev[off:off + a.nbytes].view(dtype).view(a.shape))
    return out
