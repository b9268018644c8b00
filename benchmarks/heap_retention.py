"""How much freed tensor memory glibc keeps resident, and what `looprl.engines.heap` hands back.

Frees one 16 MB tensor (served by mmap: freeing it raises glibc's mmap threshold), then
allocates `--blocks` tensors of 1-8 MB with small ones between them, frees the large ones and
prints the RSS at each point, then the RSS after `return_free_memory()` and the seconds it took.
Measures and prints; asserts nothing.

    .venv/bin/python -m benchmarks.heap_retention --blocks 2000
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from looprl.engines.heap import free_heap_bytes, resident_bytes, return_free_memory


def rss_gb() -> float:
    """This process's resident set, GB."""
    return resident_bytes() / 1e9


def main() -> None:
    """Allocate, free, trim; print the RSS after each."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=2000, help="tensors of 1-8 MB to allocate")
    args = p.parse_args()
    first = torch.ones(4_000_000)  # 16 MB, mmapped; its free raises the threshold to 16 MB
    del first
    rng = random.Random(0)
    keep, blocks = [], []
    for i in range(args.blocks):
        blocks.append(torch.ones(rng.randint(250_000, 2_000_000)))
        if i % 7 == 0:
            keep.append(torch.ones(256))
    print(f"allocated: RSS {rss_gb():.2f} GB ({len(keep)} small tensors kept between the blocks)")
    del blocks
    free = free_heap_bytes()
    print(f"freed:     RSS {rss_gb():.2f} GB, free in the heap {(free or 0) / 1e9:.2f} GB")
    start = time.perf_counter()
    trimmed = return_free_memory()
    took = time.perf_counter() - start
    print(f"returned:  RSS {rss_gb():.2f} GB (trimmed: {trimmed}, {took:.2f} s)")


if __name__ == "__main__":
    main()
