"""Freed memory goes back to the OS: glibc's raised mmap threshold would keep freed tensors resident."""

from __future__ import annotations

import random

import pytest
import torch

from looprl.engines import heap


def _rss_gb() -> float:
    return heap.resident_bytes() / 1e9


@pytest.mark.skipif(heap.free_heap_bytes() is None, reason="glibc 2.33+ only (mallinfo2)")
def test_freed_tensors_leave_the_rss_once_returned() -> None:
    big = torch.ones(4_000_000)  # 16 MB: served by mmap; freeing it raises glibc's threshold
    del big
    rng = random.Random(0)
    keep, blocks = [], []
    for i in range(300):  # ~0.7 GB of 1-4 MB tensors, now from the heap, small ones between
        blocks.append(torch.ones(rng.randint(250_000, 1_000_000)))
        if i % 7 == 0:
            keep.append(torch.ones(256))
    held = sum(b.numel() * 4 for b in blocks) / 1e9
    before = _rss_gb()
    del blocks
    assert heap.free_heap_bytes() > heap.TRIM_ABOVE  # freed, but still the process's pages
    assert _rss_gb() > before - held / 2
    assert heap.return_free_memory()
    assert _rss_gb() < before - held / 2
    assert keep  # the small tensors between the blocks stayed alive throughout
