"""Barrier vs k-step async vs streaming groups on the long-tail calculator: where the step's time goes.

Trains the same GRPO run once per mode on `looprl.testing.long_tail` (the calculator, one
episode in `--every` waiting `--slow-s` seconds per turn) and prints, per mode: seconds per
step, the trainer's wait share of wall time, generated tokens/s, mean staleness, and held-out
accuracy after the same number of steps. Measures; asserts nothing.

    .venv/bin/python -m benchmarks.async_pipeline                  # tiny model, TorchEngine
    .venv/bin/python -m benchmarks.async_pipeline --engine vllm    # needs the vLLM venv
    .venv/bin/python -m benchmarks.async_pipeline --quick          # smoke-sized

Modes: `barrier` (trainer.max_async_steps = 0), `async` (k = `--k`, batches generated ahead),
`streaming` (trainer.streaming, k = `--k`, trainer.in_flight_updates = false: a sync holds new
requests and waits for those being generated) and `streaming+in-flight` (the engine swaps the
weights between decode steps and every request goes on; run when the engine declares
`in_flight_updates`). The first step (the
pipeline filling) and the last (it holds the evaluation) are left out of the per-step numbers.
Wait share = 1 - (update + sync seconds) / step wall time: the share of the step the trainer
was not computing, the same formula in every mode; beside it, streaming's own count
(`stream/trainer_wait_s`: waits for groups and for the requests a sync let finish) and the
share of that spent in syncs (`stream/sync_hold_s`), both over the same wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from looprl.trainer.config import load_config
from looprl.trainer.logger import METRICS_FILE, read_metrics
from looprl.trainer.trainer import Trainer

console = Console(width=200)  # a table, not a terminal layout: never wrap or cut columns

MODES: dict[str, dict[str, Any]] = {
    "barrier": {"trainer.streaming": False, "async": False},
    "async": {"trainer.streaming": False, "async": True},
    "streaming": {"trainer.streaming": True, "trainer.in_flight_updates": False, "async": True},
    "streaming+in-flight": {"trainer.streaming": True, "async": True},
}
"""Each mode's settings; `async` means trainer.max_async_steps = --k (else 0)."""


def in_flight_engine(kind: str) -> bool:
    """Whether the engine class of `kind` swaps weights while requests decode."""
    if kind == "vllm":
        from looprl.engines.vllm_engine import VLLMEngine

        return bool(getattr(VLLMEngine, "in_flight_updates", False))
    from looprl.engines.torch_engine import TorchEngine

    return bool(getattr(TorchEngine, "in_flight_updates", False))


def train(mode: str, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """One run in `mode`; its metric rows."""
    settings = dict(MODES[mode])
    k = args.k if settings.pop("async") else 0
    cfg = load_config(
        None,
        {
            "model.name": args.model, "env.name": "looprl.testing.long_tail",
            "env.kwargs": {"every": args.every, "slow_s": args.slow_s},
            "engine.kind": args.engine, "rollout.tasks_per_step": args.tasks,
            "rollout.rollouts_per_task": args.rollouts, "rollout.max_tokens": args.max_tokens,
            "trainer.steps": args.steps, "trainer.max_async_steps": k, "trainer.eval_every": 0,
            "trainer.eval_tasks": args.eval_tasks, "trainer.save_every": args.steps,
            "trainer.save_rollouts": 0, "trainer.seed": args.seed, "run.output_dir": str(out),
            "algorithm.updates_per_batch": args.updates_per_batch,
            "run.name": mode, "run.tensorboard": False, **settings,
        },
    )  # fmt: skip
    trainer = Trainer(cfg)
    trainer.run()
    return read_metrics(trainer.run_dir / METRICS_FILE)


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per-step numbers over the steps between the first and the last, and the final accuracy."""
    middle = rows[1:-1]
    wall = rows[-2]["wall_time"] - rows[0]["wall_time"]
    busy = sum(r["time/train"] + r["time/sync"] for r in middle)
    key = "async/staleness_mean"  # per trained token, in every mode
    staleness = statistics.mean(r.get(key, r["rollout/staleness"]) for r in middle)
    streamed = "stream/trainer_wait_s" in middle[0]
    stream_wait = sum(r.get("stream/trainer_wait_s", 0.0) for r in middle)
    hold = sum(r.get("stream/sync_hold_s", 0.0) for r in middle)
    return {
        "s_per_step": wall / len(middle),
        "wait": 1 - busy / wall,
        "stream_wait": stream_wait / wall if streamed else float("nan"),
        "hold": hold / wall,
        "tokens_per_s": sum(r["rollout/gen_tokens"] for r in middle) / wall,
        "staleness": staleness,
        "dropped": sum(r["rollout/stale_dropped"] for r in middle),
        "accuracy": rows[-1]["eval/reward"],
    }


def table(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> Table:
    """One row per mode."""
    t = Table(
        title=f"{args.model} on long_tail (1 episode in {args.every} waits {args.slow_s} s a "
        f"turn), engine {args.engine}, {args.tasks} tasks x {args.rollouts} rollouts, "
        f"{args.steps} steps, k = {args.k}, {args.updates_per_batch} update(s) a batch, "
        f"{args.threads} thread(s), load "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    cols = ("mode", "s / step", "trainer wait", "stream wait", "of it sync hold", "gen tok/s",
            "staleness", "episodes dropped", "held-out accuracy")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="right")
    for mode, r in results.items():
        streamed = r["stream_wait"] == r["stream_wait"]  # NaN: not a streaming row
        stream_wait = f"{r['stream_wait']:.1%}" if streamed else "-"
        hold = f"{r['hold']:.1%}" if streamed else "-"
        t.add_row(
            mode, f"{r['s_per_step']:.2f}", f"{r['wait']:.1%}", stream_wait, hold,
            f"{r['tokens_per_s']:.0f}", f"{r['staleness']:.2f}", f"{r['dropped']:.0f}",
            f"{r['accuracy']:.3f}",
        )  # fmt: skip
    return t


def parse_args() -> argparse.Namespace:
    """The command line (see the module doc)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--engine", choices=["torch", "vllm"], default="torch")
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--tasks", type=int, default=4, help="tasks (groups) per step")
    p.add_argument("--rollouts", type=int, default=4, help="rollouts per task")
    p.add_argument("--max-tokens", type=int, default=96, help="tokens per turn (calculator: 96)")
    p.add_argument("--every", type=int, default=16, help="one episode in EVERY is slow")
    p.add_argument("--slow-s", type=float, default=2.0, help="seconds a slow episode waits a turn")
    p.add_argument("--k", type=int, default=1, help="trainer.max_async_steps of the async modes")
    p.add_argument(
        "--updates-per-batch", type=int, default=1,
        help="optimizer passes per batch: more makes the update, not generation, the bottleneck",
    )  # fmt: skip
    p.add_argument("--eval-tasks", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--quick", action="store_true", help="3 steps of 2x2 rollouts (smoke test)")
    args = p.parse_args()
    if args.quick:
        args.steps, args.tasks, args.rollouts, args.eval_tasks, args.slow_s = 3, 2, 2, 2, 0.5
    return args


def main() -> None:
    """Run every mode the engine supports and print the table."""
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.engine == "vllm":
        from looprl.engines.vllm_venv import vllm_python

        vllm_python(install=False)  # no venv: one line saying `make vllm`
    in_flight = in_flight_engine(args.engine)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES if in_flight else [m for m in MODES if m != "streaming+in-flight"]:
            results[mode] = summarize(train(mode, args, Path(tmp)))
    console.print(table(args, results))
    if not in_flight:
        console.print(f"streaming+in-flight: not run, the {args.engine} engine declares no "
                      "in_flight_updates")  # fmt: skip


if __name__ == "__main__":
    main()
