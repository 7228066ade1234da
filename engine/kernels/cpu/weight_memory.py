"""Memory for packed weights, on transparent huge pages where Linux gives them.

A decode step streams every weight once, and with 4 KB pages every 4 KB of weights costs a
TLB miss (a two-level page walk inside a VM); 2 MB pages take a walk per 2 MB. On the 2-core
EPYC VM the batch-1 linears stream ~15 % faster from huge pages (docs/benchmarks.md, "CPU:
packed weights on huge pages"). Linux grants them to anonymous memory that asks with
madvise(MADV_HUGEPAGE) before it is touched (the default `transparent_hugepage=madvise`).

One huge page is resident whole once any byte of it is written, so weights are carved out of
shared chunks of CHUNK_BYTES (each weight's start on a cache line) rather than each rounding
itself up to 2 MB: a model wastes at most part of a huge page per chunk. A weight larger than
half a chunk gets a chunk of its own. A chunk lives while any weight carved from it does (each
is a view of the chunk's tensor). Elsewhere (no Linux huge pages, or madvise refused) the
chunks are plain anonymous memory, which costs nothing against torch.empty.

The dense weights that packing replaces go back to the C heap, where the packed copies no
longer reuse them; `release_freed` returns such free heap memory to the OS after packing.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import threading

import torch

HUGE_PAGE = 2 << 20
CHUNK_BYTES = 64 << 20
ALIGN = 64  # bytes: each weight starts on a cache line


class _Chunk:
    """Anonymous private memory of `size` bytes from a huge-page boundary, advised for huge
    pages where the OS takes the advice; `carve` hands out its bytes in order."""

    def __init__(self, size: int) -> None:
        mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        raw = torch.frombuffer(mapping, dtype=torch.uint8)  # holds the mapping while any view lives
        start = -raw.data_ptr() % HUGE_PAGE
        advice = getattr(mmap, "MADV_HUGEPAGE", None)
        if advice is not None:
            with contextlib.suppress(OSError):  # a kernel without transparent huge pages: plain pages
                mapping.madvise(advice, start, size)
        self.bytes = raw[start : start + size]
        self.used = 0

    def carve(self, nbytes: int) -> torch.Tensor | None:
        """`nbytes` bytes from a cache-line boundary, or None when they do not fit."""
        start = math.ceil(self.used / ALIGN) * ALIGN
        if start + nbytes > self.bytes.numel():
            return None
        self.used = start + nbytes
        return self.bytes[start : start + nbytes]


_lock = threading.Lock()
_current: _Chunk | None = None


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor for a packed weight (module docstring)."""
    global _current
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    with _lock:
        if nbytes > CHUNK_BYTES // 2:
            region = _Chunk(math.ceil(nbytes / HUGE_PAGE) * HUGE_PAGE).carve(nbytes)
        else:
            region = _current.carve(nbytes) if _current is not None else None
            if region is None:
                _current = _Chunk(CHUNK_BYTES)
                region = _current.carve(nbytes)
    assert region is not None
    return region.view(dtype).view(shape)


def release_freed() -> None:
    """Return the C heap's free memory to the OS (glibc's malloc_trim; nothing elsewhere):
    without it the freed dense weights stay in the resident set (~60 MB of SmolLM2-135M fp32)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)
