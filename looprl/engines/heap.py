"""Hand freed memory back to the OS (glibc keeps freed tensors' pages once its mmap threshold rises).

glibc serves an allocation above its mmap threshold (128 KiB at start) with a fresh mapping that
`free` unmaps. Freeing such a block raises the threshold to its size (up to 32 MiB), so from then
on tensors below that size come from the heap, and freeing them leaves their pages resident: a
process that freed its KV cache still shows it in its RSS, and the next phase (an update, another
bootstrap round, a training run started in the same process) adds its own memory on top.
`malloc_trim(0)` returns the free pages: `python -m benchmarks.heap_retention` shows both (9.2 GB
resident after the free, 0.25 GB after the trim, which took 0.72 s; torch 2.13, glibc 2.36).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

TRIM_ABOVE = 256 << 20
"""Free heap bytes below which trimming is not worth the page faults that re-filling them costs."""


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (2.33+): every field a size_t."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


@functools.cache
def _libc() -> Any:
    """glibc, or None where the C library has no `malloc_trim` (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "malloc_trim"):
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    if hasattr(libc, "mallinfo2"):
        libc.mallinfo2.restype = _MallInfo2
    return libc


def resident_bytes() -> int:
    """This process's resident set now, bytes (Linux `/proc/self/statm`)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def free_heap_bytes() -> int | None:
    """Bytes the heap and arenas hold free (glibc's `mallinfo2().fordblks`, trimmed pages
    included: a trim returns their pages, not the blocks); None if unknown."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    return int(libc.mallinfo2().fordblks)


def return_free_memory(above: int = TRIM_ABOVE) -> bool:
    """Give the pages of freed blocks back to the OS when more than `above` bytes lie free (or
    when glibc cannot say how many); True if it trimmed. A no-op off glibc."""
    libc = _libc()
    if libc is None:
        return False
    free = free_heap_bytes()
    if free is not None and free <= above:
        return False
    libc.malloc_trim(0)
    return True
