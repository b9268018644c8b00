"""Torch's intra-op thread count for one block of work on the calling OS thread (the engine's steps).

Under OpenMP, `torch.set_num_threads` sets the calling thread's own count (`omp_set_num_threads`,
MKL's thread-local count) and the default of threads that have not run torch yet; threads that
already did keep theirs. On the engine's worker thread, a decode-shaped matmul (64x576 @ 576x1536)
runs about 2.6x faster on one thread than on two on a 2-core machine, and prefill-shaped ones
(512 or 2048 rows) 1.2-2x (docs/benchmarks.md, "Decode on CPU"), so the engine runs each step on
one thread by default and restores the count after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with `count` torch threads on this OS thread, then restore the previous count.

    None leaves the count alone.
    """
    if count is None:
        yield
        return
    previous = torch.get_num_threads()
    if count == previous:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
