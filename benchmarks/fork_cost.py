"""What a fork costs on this machine: page tables and copy-on-write faults, measured and printed.

    python -m benchmarks.fork_cost            # 64 MB of memory, 300 forks per case

A process maps and fills an anonymous region (in 4 KiB pages, or in huge pages), then forks
children that write to `touch` of its pages (each write copies one page) and exit. It prints
the CPU per fork of the parent (copying page tables) and of the child (its faults and the
page-table teardown at exit). This is the cost model behind the sandbox's design: a fork-server
call pays for every page its processes write after the fork, and for the page tables forked.
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource

PAGE = 4096


def measure(mb: int, huge: bool, touch: int, forks: int) -> tuple[float, float]:
    """CPU ms per fork in the parent and in the child."""
    size = mb << 20
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    region.write(b"\1" * size)
    pages = size // PAGE
    stride = 37  # coprime with the page count: `touch` distinct pages spread over the region
    offsets = [(i * stride % pages) * PAGE for i in range(touch)]
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            for off in offsets:
                region[off] = 2
            os._exit(0)
        os.waitpid(pid, 0)
    me2, kids2 = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    region.close()

    def cpu(a: resource.struct_rusage, b: resource.struct_rusage) -> float:
        return (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) / forks * 1e3

    return cpu(me, me2), cpu(kids, kids2)


def main(argv: list[str] | None = None) -> None:
    """Print one line per case."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--forks", type=int, default=300)
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPU cores; {args.mb} MB region; {args.forks} forks per case")
    print("| pages | pages written by the child | parent CPU ms/fork | child CPU ms/fork |")
    print("|---|---|---|---|")
    for huge in (False, True):
        for touch in (0, 2000):
            parent, child = measure(args.mb, huge, touch, args.forks)
            kind = "huge (2 MB)" if huge else "4 KiB"
            print(f"| {kind} | {touch} | {parent:.2f} | {child:.2f} |")


if __name__ == "__main__":
    main()
