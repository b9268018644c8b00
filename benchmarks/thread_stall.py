"""A decode-shaped matmul on a second Python thread (where TorchEngine runs its model), four ways.

Each case runs in a fresh process, because OpenMP reads OMP_WAIT_POLICY once, when torch loads:

- `default`: the thread inherits torch's default count (one per core) and libgomp's default wait;
- `passive`: the same with OMP_WAIT_POLICY=PASSIVE (waiting threads sleep at once);
- `one-thread`: the thread calls `torch.set_num_threads(1)` itself (`TorchEngine(threads=1)`);
- `main-thread`: the default count, run on the main thread (no second Python thread at all).

With `--busy N`, N processes spin (`while True: pass`) beside every case, as tool subprocesses,
the trainer or other jobs do in a GRPO run. Each matmul is an OpenMP region split statically
over the threads: when a core is taken, the region ends only when the scheduler gives its last
thread a slice, so small matmuls on two threads slow down however they are called.

Prints GFLOP/s of `(rows, 576) @ (576, 1536)` (SmolLM2-135M's MLP; 64 rows: decode at batch 64,
2048: a prefill), median of `--rounds` alternating rounds, with the process's CPU time over wall
time and the load average.

    python -m benchmarks.thread_stall --rounds 3 --rows 64,2048
    python -m benchmarks.thread_stall --rounds 3 --rows 64,2048 --busy 1   # a busy neighbour
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

CHILD = """
import threading, time, torch
x, w = torch.randn({rows}, 576), torch.randn(576, 1536)
n = max(10, 25600 // {rows})
def work(out):
    if {one}: torch.set_num_threads(1)
    for _ in range(max(2, n // 8)): x @ w
    t, c = time.perf_counter(), time.process_time()
    for _ in range(n): x @ w
    wall = time.perf_counter() - t
    out.append((2 * {rows} * 576 * 1536 * n / wall / 1e9, (time.process_time() - c) / wall))
out = []
if {main}:
    work(out)
else:
    th = threading.Thread(target=work, args=(out,)); th.start(); th.join()
print(out[0][0], out[0][1])
"""
SPIN = "while True: pass"

CASES = {  # environment, one thread, on the main thread
    "default": ({}, False, False),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, False, False),
    "one-thread": ({}, True, False),
    "main-thread": ({}, False, True),
}


def run_case(name: str, rows: int, busy: int = 0) -> tuple[float, float]:
    """GFLOP/s and CPU/wall of one case and matmul height in a fresh interpreter, beside `busy`
    spinning processes."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        return _run_child(name, rows)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _run_child(name: str, rows: int) -> tuple[float, float]:
    """GFLOP/s and CPU/wall of one case in a fresh interpreter."""
    extra, one, main = CASES[name]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env.update(extra)
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(one=one, rows=rows, main=main)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), float(out[1])


def main(argv: list[str] | None = None) -> None:
    """Alternate the cases for `--rounds` rounds and print one line each."""
    p = argparse.ArgumentParser(description="decode-shaped matmul on a second thread, four ways")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", default="64", help="comma list of matmul heights")
    p.add_argument("--busy", type=int, default=0, help="spinning processes beside each case")
    args = p.parse_args(argv)
    heights = [int(r) for r in args.rows.split(",")]
    results: dict[tuple[int, str], list[tuple[float, float]]] = {
        (h, name): [] for h in heights for name in CASES
    }
    for _ in range(args.rounds):
        for h, name in results:
            results[h, name].append(run_case(name, h, args.busy))
    for (h, name), samples in results.items():
        rates = [r[0] for r in samples]
        cpu = statistics.median(r[1] for r in samples)
        print(
            f"rows {h:>5} {name:<11} {statistics.median(rates):6.1f} GFLOP/s "
            f"[{min(rates):.1f}-{max(rates):.1f}]"
            f"  cpu/wall {cpu:.2f}  busy {args.busy}  load {os.getloadavg()[0]:.2f}"
        )


if __name__ == "__main__":
    main()
