"""Host memory of the engine's large buffers: the weights and KV pools a decode step
streams, backed by transparent huge pages (``_C.advise_huge_pages``) so that they are read
through 2 MiB pages rather than 4 KiB ones (fewer TLB misses; the hardware prefetchers do
not stop at every 4 KiB); and the heap a load freed handed back to the system."""
from __future__ import annotations

import ctypes
import gc
import math
import mmap
import sys

import torch

from .. import _C

HUGE_PAGE = 1 << 21


def _advised(raw: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The first ``nbytes`` of ``raw`` (uint8, ``nbytes`` + HUGE_PAGE long, untouched) from
    its first 2 MiB boundary on, advised for huge pages."""
    skip = -raw.data_ptr() % HUGE_PAGE
    buf = raw[skip:skip + nbytes]
    _C.advise_huge_pages(buf.data_ptr(), nbytes)
    return buf


def huge_page_empty(nbytes: int) -> torch.Tensor:
    """An uninitialised CPU uint8 tensor of ``nbytes`` starting on a 2 MiB boundary, advised
    for huge pages before anything touches it (so its pages fault in 2 MiB at a time where
    the kernel allows). Off Linux, or with SONARSPEC_NO_HUGE_PAGES=1, a plain buffer."""
    if nbytes < HUGE_PAGE:
        return torch.empty(nbytes, dtype=torch.uint8)
    return _advised(torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8), nbytes)


def huge_page_zeros(shape, dtype: torch.dtype) -> torch.Tensor:
    """Zeros of ``shape`` and ``dtype`` (contiguous, CPU) in fresh anonymous memory advised
    for huge pages: the system hands out zero-filled pages as they are first touched, so a
    KV pool costs resident memory only for the part the requests have used so far."""
    if not sys.platform.startswith("linux"):
        return torch.zeros(shape, dtype=dtype)
    nbytes = math.prod(int(d) for d in shape) * torch.empty((), dtype=dtype).element_size()
    anon = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE)   # private: huge pages apply (not shmem)
    raw = torch.frombuffer(anon, dtype=torch.uint8)   # zero-filled by the system as pages are touched
    return _advised(raw, nbytes).view(dtype).view(*shape)


def return_freed_memory(collect: bool = True) -> None:
    """Hands the heap memory freed so far back to the system (glibc's malloc_trim; after a
    garbage collection unless ``collect`` is False): loading frees many buffers (file reads,
    per-matrix copies before fusing and packing) that would otherwise stay in the process's
    resident set. Elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    if collect:
        gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc
        pass
