"""Seconds per GRPO step on the calculator, split into generate / score / train, and training tokens/s.

Runs a short GRPO job per model and prints the median (min, max) over the steps after the
first (warm-up). Measures; asserts nothing. `train tok/s` counts the tokens that went through
forward and backward ("forwarded"): zero-advantage samples are skipped, so start from a model
whose groups disagree (a warm-started one such as `runs/demo/sft`) to time the update.

    .venv/bin/python -m benchmarks.train_step --models runs/demo/sft smollm2-135m --steps 4
    .venv/bin/python -m benchmarks.train_step --quick          # smoke-sized

`--compare-ref REF` runs the same step on a git ref's code and on the working tree, interleaved
over `--rounds`, and prints the pairwise speed-up and forwarded positions per trained token
(`benchmarks/compare_ref.py`).

`--nproc 1 2` instead times `looprl train --nproc N` (torchrun and FSDP2 for N > 1, each
process with `--threads` threads) and prints one row per model and N: seconds per step, its
generate / train / sync split (rank 0's clock; the batch is split over the ranks) and the
job's trained tokens/s (the whole batch's forwarded tokens over the train seconds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.roofline import matmul_gflops, model_flops_per_token, roofline_line
from looprl.trainer.config import load_config
from looprl.trainer.logger import METRICS_FILE, read_metrics
from looprl.trainer.trainer import Trainer

console = Console(width=200)  # a table, not a terminal layout: never wrap or cut columns


def run(
    model: str, steps: int, tasks: int, rollouts: int, lora: bool, out: Path
) -> tuple[list[dict], float]:
    """Train `steps` GRPO steps; return the metric rows and the model's forward FLOPs per token."""
    cfg = load_config(
        None,
        {
            "model.name": model, "model.lora": lora, "trainer.steps": steps, "trainer.eval_every": 0,
            "trainer.eval_tasks": 1, "trainer.save_every": steps, "trainer.save_rollouts": 0,
            "rollout.tasks_per_step": tasks, "rollout.rollouts_per_task": rollouts,
            "run.output_dir": str(out), "run.name": f"{Path(model).name}-{'lora' if lora else 'full'}",
            "run.tensorboard": False,
        },
    )  # fmt: skip
    trainer = Trainer(cfg)
    trainer.run()
    rows = read_metrics(trainer.run_dir / METRICS_FILE)
    return rows, model_flops_per_token(trainer.engine.model)  # the TorchEngine's: LoRA merged


def run_processes(
    model: str, nproc: int, threads: int, args: argparse.Namespace, out: Path
) -> list[dict]:
    """`looprl train --nproc N` in a subprocess (each process `threads` threads); its metric rows."""
    run_dir = out / f"{Path(model).name}-n{nproc}"
    cmd = [sys.executable, "-m", "looprl", "train", "--nproc", str(nproc), "--run-dir", str(run_dir),
           "--model.name", model, "--model.lora", str(args.lora).lower(),
           "--trainer.steps", str(args.steps), "--trainer.eval_every", "0",
           "--trainer.eval_tasks", "1", "--trainer.save_every", str(args.steps),
           "--trainer.save_rollouts", "0", "--rollout.tasks_per_step", str(args.tasks),
           "--rollout.rollouts_per_task", str(args.rollouts), "--run.tensorboard", "false"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(
            f"looprl train --nproc {nproc} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return read_metrics(run_dir / METRICS_FILE)


def nproc_table(args: argparse.Namespace) -> Table:
    """One row per model and process count: step seconds, their split, trained tokens/s."""
    load = os.getloadavg()[0]
    table = Table(
        title=f"GRPO step under looprl train --nproc N ({args.tasks} tasks x {args.rollouts} "
        f"rollouts, {args.threads} thread(s) per process, load {load:.1f} at start)"
    )
    cols = ("model", "N", "s / step", "generate s", "train s", "sync s", "train tok/s",
            "forwarded tokens")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            for n in args.nproc:
                rows = run_processes(model, n, args.threads, args, Path(tmp))
                rows = rows[1:] if len(rows) > 1 else rows  # the first step warms caches up
                total = [
                    r["time/generate"] + r["time/score"] + r["time/train"] + r["time/sync"]
                    for r in rows
                ]
                table.add_row(
                    model, str(n), fmt(total), fmt([r["time/generate"] for r in rows]),
                    fmt([r["time/train"] for r in rows]), fmt([r["time/sync"] for r in rows]),
                    fmt([r["train/tokens_per_s"] for r in rows]), fmt([r["train/forward_tokens"] for r in rows]),
                )  # fmt: skip
    return table


def fmt(values: list[float]) -> str:
    """median (min-max)."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    """Benchmark each model and print one table."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", nargs="+", default=["tiny"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--lora", action="store_true", help="train LoRA adapters instead of all weights")
    p.add_argument(
        "--quick", action="store_true", help="2 steps of 2x2 rollouts on tiny (smoke test)"
    )
    p.add_argument(
        "--nproc", type=int, nargs="+", default=None,
        help="time looprl train --nproc N for each N given (torchrun + FSDP2 when N > 1)",
    )  # fmt: skip
    p.add_argument("--threads", type=int, default=1, help="threads per process with --nproc")
    p.add_argument(
        "--compare-ref", default=None, metavar="REF",
        help="time the same step on git REF's code and on the working tree, interleaved",
    )  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="--compare-ref: runs on each code")
    args = p.parse_args()
    if args.quick:
        args.models, args.steps, args.tasks, args.rollouts = ["tiny"], 2, 2, 2
    if args.compare_ref:
        from benchmarks.compare_ref import compare

        for model in args.models:
            console.print(compare(args.compare_ref, model, args))
        return
    if args.nproc:
        if min(args.nproc) < 1 or args.threads < 1:
            raise SystemExit("error: --nproc and --threads take numbers >= 1")
        console.print(nproc_table(args))
        return
    table = Table(
        title=f"GRPO step on calculator ({args.tasks} tasks x {args.rollouts} rollouts, {torch.get_num_threads()} threads)"
    )
    for col in (
        "model",
        "s / step",
        "generate s",
        "score s",
        "train s",
        "train tok/s",
        "gen tok/s",
        "trained tokens",
        "forwarded tokens",
    ):
        table.add_column(col, justify="right")
    roof = matmul_gflops()[0]
    roofs = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            rows, flops = run(model, args.steps, args.tasks, args.rollouts, args.lora, Path(tmp))
            rows = rows[1:] if len(rows) > 1 else rows  # the first step warms caches up
            total = [
                r["time/generate"] + r["time/score"] + r["time/train"] + r["time/sync"]
                for r in rows
            ]
            table.add_row(
                model, fmt(total), fmt([r["time/generate"] for r in rows]), fmt([r["time/score"] for r in rows]),
                fmt([r["time/train"] for r in rows]), fmt([r["train/tokens_per_s"] for r in rows]),
                fmt([r["rollout/tokens_per_s"] for r in rows]), fmt([r["train/tokens"] for r in rows]),
                fmt([r["train/forward_tokens"] for r in rows]),
            )  # fmt: skip
            # training: forward + backward ~ 3x the forward FLOPs over every position of the batch;
            # LoRA ~ 2x (frozen matrices get no weight gradient, only the activations' one)
            factor = 2 if args.lora else 3
            train_pos_s = statistics.median(
                r["train/forward_positions"] / r["time/train"] for r in rows
            )
            gen_tok_s = statistics.median(r["rollout/tokens_per_s"] for r in rows)
            roofs.append(roofline_line(f"{model} train", factor * flops, train_pos_s, roof))
            roofs.append(roofline_line(f"{model} generate (decode only)", flops, gen_tok_s, roof))
    console.print(table)
    for line in roofs:
        console.print(line)


if __name__ == "__main__":
    main()
