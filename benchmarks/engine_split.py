"""What generation in one-thread worker processes would reach: N engines on 1/N of a batch each.

Small-matrix decode does not scale with threads on this CPU (docs/benchmarks.md, "Decode on
CPU"), so the issue of speed asks whether worker processes of one thread each would. This script
measures the bound before anything is built: N processes, each with its own copy of the model
(built from the same seed) and a `TorchEngine(threads=1)`, are started once; in each run they
are released together on 1/N of the batch each, and the run's wall time is that of the slowest.
The other sides are `model.generate` on the whole batch with the process's threads (the
like-for-like baseline of `benchmarks/engine.py`) and one TorchEngine on the whole batch with its
defaults. Sides alternate; tokens/s is median [min-max], ratios are taken run by run.

    python -m benchmarks.engine_split --models smollm2-shape --batch-sizes 32,64 --workers 2
    python -m benchmarks.engine_split --quick        # a smoke test in seconds
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from multiprocessing.connection import Connection

import torch

from benchmarks.engine import (
    Workload,
    bench_engine,
    load_named,
    make_workload,
    run_engine,
    run_hf,
    timed,
)


def worker(conn: Connection, name: str, work: Workload) -> None:
    """A one-thread engine on its share of the batch: warm up, then run it at each 'go'."""
    torch.set_num_threads(1)
    model, tokenizer = load_named(name)
    engine = bench_engine(model, tokenizer, work, threads=1)
    try:
        run_engine(engine, Workload(work.prompts, [2] * len(work.lengths)))
        conn.send("ready")
        while conn.recv() == "go":
            run_engine(engine, work)
            conn.send("done")
    finally:
        engine.shutdown()


class Workers:
    """N worker processes, each holding 1/N of a workload's requests."""

    def __init__(self, name: str, work: Workload, n: int) -> None:
        ctx = mp.get_context("spawn")  # a fork after torch's thread pool started can hang
        self.conns: list[Connection] = []
        self.procs = []
        for i in range(n):
            share = Workload(work.prompts[i::n], work.lengths[i::n])
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker, args=(child, name, share), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:
            if conn.recv() != "ready":
                raise RuntimeError("a worker failed to start")
        self.tokens = work.useful_tokens

    def run(self) -> float:
        """Release every worker at once; tokens/s over the slowest one's wall time."""
        start = time.perf_counter()
        for conn in self.conns:
            conn.send("go")
        for conn in self.conns:
            conn.recv()
        return self.tokens / (time.perf_counter() - start)

    def close(self) -> None:
        """Stop the workers."""
        for conn in self.conns:
            conn.send("stop")
        for proc in self.procs:
            proc.join(timeout=30)


def bench(name: str, batch: int, args: argparse.Namespace) -> dict[str, list[float]]:
    """Alternate the three sides `args.runs` times on one workload; tokens/s samples of each."""
    model, tokenizer = load_named(name)
    vocab = model.get_input_embeddings().weight.shape[0]
    work = make_workload(args.scenario, vocab, batch, args.prompt_len, args.new_tokens)
    engine = bench_engine(model, tokenizer, work)
    workers = Workers(name, work, args.workers)
    samples: dict[str, list[float]] = {"generate": [], "engine": [], "split": []}
    sides = {
        "generate": lambda: timed(lambda: run_hf(model, work), time.perf_counter),
        "engine": lambda: timed(lambda: run_engine(engine, work), time.perf_counter),
        "split": workers.run,
    }
    try:
        run_hf(model, Workload(work.prompts, [2] * batch))
        run_engine(engine, Workload(work.prompts, [2] * batch))
        order = list(sides)
        for r in range(args.runs):
            for side in order[r % len(order) :] + order[: r % len(order)]:
                samples[side].append(sides[side]())
    finally:
        workers.close()
        engine.shutdown()
    return samples


def _cell(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]"


def _ratio(a: list[float], b: list[float]) -> str:
    return f"{statistics.median(x / y for x, y in zip(a, b, strict=True)):.2f}x"


def main(argv: list[str] | None = None) -> None:
    """Parse flags, run, print one line per model and batch size."""
    p = argparse.ArgumentParser(description="one-thread engine processes vs generate, tokens/s")
    p.add_argument("--models", default="smollm2-shape", help="comma list, as benchmarks.engine")
    p.add_argument("--batch-sizes", default="32,64")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--scenario", choices=["fixed", "rl"], default="fixed")
    p.add_argument("--quick", action="store_true", help="tiny budget: a smoke test in seconds")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.batch_sizes, args.prompt_len, args.new_tokens, args.runs = (
            "smollm2-shape-small", "4", 8, 4, 1,
        )  # fmt: skip
    print(
        f"scenario {args.scenario}; torch {torch.__version__}, {torch.get_num_threads()} threads "
        f"for generate and the whole-batch engine; {args.workers} one-thread engine processes; "
        f"prompt {args.prompt_len}, {args.new_tokens} new tokens; {args.runs} runs; tokens/s, "
        "median [min-max]"
    )
    print("model | batch | generate | engine | split engines | engine/generate | split/generate")
    for name in args.models.split(","):
        for batch in [int(b) for b in args.batch_sizes.split(",")]:
            s = bench(name.strip(), batch, args)
            print(
                f"{name.strip()} | {batch} | {_cell(s['generate'])} | {_cell(s['engine'])} | "
                f"{_cell(s['split'])} | {_ratio(s['engine'], s['generate'])} | "
                f"{_ratio(s['split'], s['generate'])}",
                flush=True,
            )


if __name__ == "__main__":
    main()
