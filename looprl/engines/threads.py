"""Torch's intra-op thread count for one block of work on the calling OS thread (decode runs on one).

Under OpenMP, `torch.set_num_threads` sets the calling thread's own count (`omp_set_num_threads`,
MKL's thread-local count) and the default of threads that have not run torch yet; threads that
already did keep theirs. A decode-shaped matmul (64x576 @ 576x1536) runs about 4x faster on one
thread than on two on a 2-core machine (docs/benchmarks.md, "Decode threads"), while a
training-shaped one scales, so the engine decodes on one thread and prefills on the default.
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
