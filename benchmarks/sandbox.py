"""Sandbox latency and throughput per backend, against a fresh `python -c` process.

    python -m benchmarks.sandbox                 # all backends, default sizes
    python -m benchmarks.sandbox --calls 100 --backends forkserver
    python -m benchmarks.sandbox --backends forkserver --preload numpy   # numpy only
    python -m benchmarks.sandbox --backends forkserver --lean-preload none  # one template
    python -m benchmarks.sandbox --backends forkserver --breakdown   # CPU by process role
    python -m benchmarks.sandbox --session-stop --calls 300 --rounds 5   # cost of the session stop
    python -m benchmarks.sandbox --fairness --rounds 3   # a quick call behind 8 long ones

For each backend and each snippet (`print(2+2)`, a small numpy computation and a small
numpy + sympy one) it reports the median and p90 latency of sequential calls, the calls per
second with 4 concurrent callers, and the CPU time spent per call by every process involved
(measured with a cgroup when the benchmark may create one, so other jobs on the machine do not
count), and from it the calls/s the cores could sustain with the machine to itself. The
4-caller phase runs `--rounds` times (the speed of a shared VM drifts from minute to minute):
the table shows the median round, and the last column every round. Targets for the default
backend on 2 cores: median <= 15 ms and >= 300 calls/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from looprl.sandbox import (
    ExecResult,
    ExecStatus,
    Executor,
    ForkServerExecutor,
    SandboxLimits,
    SubprocessExecutor,
)

SNIPPETS = {
    "print(2+2)": "print(2+2)",
    "numpy": "import numpy as np\nprint(np.linalg.det(np.eye(3) * 2), np.arange(10).sum())",
    "numpy+sympy": (
        "import numpy as np, sympy as sp\n"
        "x = sp.Symbol('x')\n"
        "print(np.linalg.det(np.eye(3) * 2), sp.factor(x**2 - 1), sp.Rational(1, 3) + sp.Rational(1, 6))"
    ),
}
CONCURRENCY = 4


class CpuMeter:
    """CPU seconds used by this process and all its descendants, via a cgroup of their own.

    Falls back to None when no cgroup can be created (not root, read-only cgroupfs).
    """

    def __init__(self) -> None:
        self.read: Callable[[], float] | None = None
        self._undo: Callable[[], None] = lambda: None
        for make in (self._cgroup_v1, self._cgroup_v2):
            with contextlib.suppress(OSError):
                make()
                return

    def _join(self, path: str) -> None:
        os.mkdir(path)
        parent = os.path.dirname(path)
        with open(f"{path}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

        def undo() -> None:
            with contextlib.suppress(OSError):
                with open(f"{parent}/cgroup.procs", "w") as f:
                    f.write(str(os.getpid()))
                os.rmdir(path)

        self._undo = undo

    def _cgroup_v1(self) -> None:
        path = f"/sys/fs/cgroup/cpuacct/looprl-bench-{os.getpid()}"
        self._join(path)
        self.read = lambda: int(Path(f"{path}/cpuacct.usage").read_text()) / 1e9

    def _cgroup_v2(self) -> None:
        root = (
            "/sys/fs/cgroup/unified"
            if os.path.isdir("/sys/fs/cgroup/unified")
            else "/sys/fs/cgroup"
        )
        path = f"{root}/looprl-bench-{os.getpid()}"
        self._join(path)

        def read() -> float:
            with open(f"{path}/cpu.stat") as f:
                return (
                    next(int(line.split()[1]) for line in f if line.startswith("usage_usec")) / 1e6
                )

        self.read = read

    def close(self) -> None:
        """Leave the cgroup and remove it."""
        self._undo()

    @contextlib.contextmanager
    def measure(self, out: list[float]) -> Iterator[None]:
        """Append the CPU seconds used inside the block to `out` (nothing when unavailable)."""
        before = self.read() if self.read else 0.0
        yield
        if self.read:
            out.append(self.read() - before)


class Breakdown:
    """Where a fork-server call's CPU goes: this process, the workers, the templates, the children.

    Reads /proc of every process below this one, by depth: the worker is the pool's child (the
    child of that child when it has a PID namespace, whose parent process only waits), and the
    templates are the workers' children. A template's reaped children's CPU and page faults are
    the sandbox children's. Linux only; CPU in clock ticks (10 ms), so use it over many calls.
    """

    ROLES = ("pool process", "workers", "templates", "sandbox children")

    def __init__(self, namespaces: bool) -> None:
        self.worker_depth = 2 if namespaces else 1

    def snapshot(self) -> dict[str, tuple[float, int]]:
        """Cumulative (CPU seconds, minor faults) per role."""
        todo, seen = [(os.getpid(), 0)], []
        while todo:
            pid, depth = todo.pop()
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    todo += [(int(k), depth + 1) for k in f.read().split()]
            except OSError:
                pass
            seen.append((pid, depth))
        tick = os.sysconf("SC_CLK_TCK")
        total = dict.fromkeys(self.ROLES, (0.0, 0))

        def add(role: str, cpu: float, faults: int) -> None:
            total[role] = (total[role][0] + cpu, total[role][1] + faults)

        for pid, depth in seen:
            if depth not in (self.worker_depth, self.worker_depth + 1):
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            own = (int(fields[11]) + int(fields[12])) / tick
            reaped = (int(fields[13]) + int(fields[14])) / tick
            if depth == self.worker_depth:
                add("workers", own, int(fields[7]))
            else:
                add("templates", own, int(fields[7]))
                add("sandbox children", reaped, int(fields[8]))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        add("pool process", usage.ru_utime + usage.ru_stime, usage.ru_minflt)
        return total

    @staticmethod
    def per_call(
        before: dict[str, tuple[float, int]], after: dict[str, tuple[float, int]], calls: int
    ) -> str:
        """One line: CPU ms and page faults per call for each role."""
        parts = []
        for role in Breakdown.ROLES:
            cpu = (after[role][0] - before[role][0]) / calls * 1e3
            faults = (after[role][1] - before[role][1]) / calls
            parts.append(f"{role} {cpu:.2f} ms / {faults:.0f} faults")
        return "; ".join(parts)  # fmt: skip


async def fresh_python(code: str, timeout: float = 60) -> ExecResult:
    """The reference: one new `python -c` process per call, no isolation at all."""
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    status: ExecStatus = "ok" if proc.returncode == 0 else "error"
    return ExecResult(status, out.decode(), err.decode(), duration=time.monotonic() - start)


async def measure(
    run: Callable[[str], Awaitable[ExecResult]],
    code: str,
    calls: int,
    meter: CpuMeter,
    rounds: int = 1,
    breakdown: Breakdown | None = None,
) -> dict[str, Any]:
    """Sequential latency (median, p90) and 4-caller throughput (median of `rounds`)."""
    for _ in range(3):  # warm-up
        assert (await run(code)).ok
    latencies = []
    for _ in range(calls):
        start = time.perf_counter()
        result = await run(code)
        latencies.append(time.perf_counter() - start)
        assert result.ok, result

    async def caller(n: int) -> None:
        for _ in range(n):
            r = await run(code)
            assert r.ok, r

    per_caller = max(1, calls // CONCURRENCY) * 2
    total = per_caller * CONCURRENCY
    speeds, cpus, splits = [], [], []
    for _ in range(rounds):
        cpu: list[float] = []
        before = breakdown.snapshot() if breakdown else None
        with meter.measure(cpu):
            start = time.perf_counter()
            await asyncio.gather(*(caller(per_caller) for _ in range(CONCURRENCY)))
            elapsed = time.perf_counter() - start
        if breakdown and before:
            splits.append(breakdown.per_call(before, breakdown.snapshot(), total))
        speeds.append(total / elapsed)
        cpus.append(cpu[0] / total * 1e3 if cpu else float("nan"))
    middle = sorted(range(rounds), key=lambda i: speeds[i])[rounds // 2]  # the median round
    return {
        "median_ms": statistics.median(latencies) * 1e3,
        "p90_ms": statistics.quantiles(latencies, n=10)[-1] * 1e3,
        "calls_per_s": speeds[middle],
        "cpu_ms_per_call": cpus[middle],
        "rounds": speeds,
        "breakdown": splits[middle] if splits else "",
    }


async def session_stop_cost(calls: int, rounds: int, meter: CpuMeter) -> None:
    """What stopping a session between calls (SIGSTOP after each cell, SIGCONT before the next)
    costs per call: sequential session calls on a one-worker pool with the stop and without,
    interleaved round by round so the VM's drift hits both alike."""
    limits = SandboxLimits(timeout=30)
    pools = {stop: ForkServerExecutor(limits, workers=1, freeze_sessions=stop) for stop in (True, False)}  # fmt: skip
    lat: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    try:
        for ex in pools.values():
            await ex.start()
            assert (await ex.execute("x = 0", session_id="bench")).ok
        for _ in range(rounds):
            for stop, ex in pools.items():
                used: list[float] = []
                with meter.measure(used):
                    for _ in range(calls):
                        start = time.perf_counter()
                        assert (await ex.execute("x += 1", session_id="bench")).ok
                        lat[stop].append(time.perf_counter() - start)
                cpu[stop].append(used[0] / calls * 1e3 if used else float("nan"))
    finally:
        for ex in pools.values():
            await ex.close()
    print(f"\n{calls} session calls (`x += 1`) x {rounds} rounds per mode, one worker")
    print("| stop between calls | median ms | p90 ms | CPU ms/call (median round) |")
    print("|---|---|---|---|")
    for stop in (True, False):
        p90 = statistics.quantiles(lat[stop], n=10)[-1]
        print(
            f"| {'yes' if stop else 'no'} | {statistics.median(lat[stop]) * 1e3:.2f} "
            f"| {p90 * 1e3:.2f} | {statistics.median(cpu[stop]):.2f} |"
        )


async def quick_behind_backlog(ex: Executor, backlog: int, seconds: float, *, fair: bool) -> float:
    """Seconds from submitting a quick call, right after `backlog` calls of `seconds` each from
    one caller, to its result. `fair`: the quick call is another caller's; otherwise the same
    caller's, which queues it behind the backlog (what the first-come-first-served pool did to
    every call)."""
    long = f"import time\ntime.sleep({seconds})"
    tasks = [asyncio.create_task(ex.execute(long, caller="flood")) for _ in range(backlog)]
    await asyncio.sleep(0)  # the backlog's tasks run up to their wait for a worker: queued first
    start = time.perf_counter()
    assert (await ex.execute("print(2+2)", caller="other" if fair else "flood")).ok
    latency = time.perf_counter() - start
    await asyncio.gather(*tasks)
    return latency


async def fairness(workers: int, backlog: int, seconds: float, rounds: int) -> None:
    """Latency of a quick call queued behind a backlog of long calls, first come first served
    (the backlog's own caller) and fair (another caller), interleaved round by round."""
    ex = ForkServerExecutor(SandboxLimits(timeout=30), workers=workers)
    await ex.start()
    runs: dict[bool, list[float]] = {False: [], True: []}
    try:
        for _ in range(rounds):
            for fair in (False, True):
                runs[fair].append(await quick_behind_backlog(ex, backlog, seconds, fair=fair))
    finally:
        await ex.close()
    whole = backlog * seconds / workers
    print(f"\n{workers} workers; a quick call after {backlog} calls of {seconds:g} s (the backlog")
    print(f"alone keeps the pool busy {whole:g} s); seconds from submitting it to its result")
    print("| queueing | median s | every round |")
    print("|---|---|---|")
    for fair in (False, True):
        name = "fair (another caller)" if fair else "first come, first served"
        rounds_s = " / ".join(f"{x:.2f}" for x in runs[fair])
        print(f"| {name} | {statistics.median(runs[fair]):.2f} | {rounds_s} |")


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200, help="sequential calls per fast backend")
    parser.add_argument(
        "--slow-calls", type=int, default=20, help="calls for per-call-interpreter backends"
    )
    parser.add_argument("--backends", default="forkserver,subprocess,python-c")
    parser.add_argument("--workers", type=int, default=None, help="fork-server workers")
    parser.add_argument(
        "--rounds", type=int, default=3, help="4-caller rounds per fast backend (median shown)"
    )
    parser.add_argument(
        "--preload",
        default="numpy,sympy",
        help="modules each fork-server worker imports (the default is the backend's: numpy,sympy)",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also print the fork server's CPU and page faults per call by process role",
    )
    parser.add_argument(
        "--lean-preload",
        default="numpy",
        help="the lean template's modules, for calls that name none of the others ('none': off)",
    )
    parser.add_argument(
        "--session-stop",
        action="store_true",
        help="only measure what stopping a session between calls costs (with and without)",
    )
    parser.add_argument(
        "--fairness",
        action="store_true",
        help="only measure a quick call's latency behind a backlog of long calls",
    )
    return parser


async def make_backend(backend: str, args: argparse.Namespace) -> Executor | None:
    """The executor named `backend` (started), or None for the bare `python -c` reference."""
    limits = SandboxLimits(timeout=30)
    if backend == "forkserver":
        preload = tuple(m for m in args.preload.split(",") if m)
        lean = (
            None
            if args.lean_preload == "none"
            else tuple(m for m in args.lean_preload.split(",") if m)
        )
        ex = ForkServerExecutor(limits, workers=args.workers, preload=preload, lean_preload=lean)
        await ex.start()
        print(ex.isolation_report().summary(), file=sys.stderr)
        return ex
    if backend == "subprocess":
        return SubprocessExecutor(limits, max_concurrency=CONCURRENCY)
    if backend == "python-c":
        return None
    raise SystemExit(f"unknown backend {backend!r}; choose forkserver, subprocess, python-c")


async def measure_backends(
    args: argparse.Namespace, meter: CpuMeter
) -> list[tuple[str, str, dict]]:
    """(backend, snippet, measurement) for every backend and snippet."""
    rows = []
    for backend in args.backends.split(","):
        ex = await make_backend(backend, args)
        run = ex.execute if ex is not None else fresh_python
        calls = args.calls if backend == "forkserver" else args.slow_calls
        rounds = args.rounds if backend == "forkserver" else 1
        split = None
        if args.breakdown and isinstance(ex, ForkServerExecutor):
            split = Breakdown(ex.namespaces)
        for name, code in SNIPPETS.items():
            m = await measure(run, code, calls, meter, rounds, split)
            rows.append((backend, name, m))
        if ex is not None:
            await ex.close()
    return rows


def print_table(rows: list[tuple[str, str, dict]], load_before: list[str]) -> None:
    """The results table, with the load average before and after."""
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(f"\n{os.cpu_count()} CPU cores; load average before {load_before}, after {load_after}")
    header = (
        f"| {'backend':<11} | {'snippet':<12} | median ms | p90 ms | calls/s (4 callers) "
        "| CPU ms/call | CPU-bound ceiling calls/s | calls/s per round |"
    )
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    cores = os.cpu_count() or 1
    for backend, name, m in rows:
        ceiling = cores * 1000 / m["cpu_ms_per_call"] if m["cpu_ms_per_call"] > 0 else float("nan")
        print(
            f"| {backend:<11} | {name:<12} | {m['median_ms']:9.1f} | {m['p90_ms']:6.1f} "
            f"| {m['calls_per_s']:19.0f} | {m['cpu_ms_per_call']:11.1f} | {ceiling:25.0f} "
            f"| {' / '.join(f'{x:.0f}' for x in m['rounds']):<17} |"
        )
    for backend, name, m in rows:
        if m.get("breakdown"):
            print(f"{backend} {name}, per call in the median round: {m['breakdown']}")


async def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table."""
    args = build_parser().parse_args(argv)
    if args.fairness:
        await fairness(args.workers or 2, backlog=8, seconds=0.5, rounds=args.rounds)
        return
    meter = CpuMeter()
    try:
        if args.session_stop:
            await session_stop_cost(args.calls, args.rounds, meter)
            return
        load_before = Path("/proc/loadavg").read_text().split()[:3]
        rows = await measure_backends(args, meter)
    finally:
        meter.close()
    print_table(rows, load_before)


if __name__ == "__main__":
    asyncio.run(main())
