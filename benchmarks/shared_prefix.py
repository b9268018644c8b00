"""The update on one real batch, each micro-batch as a prefix tree against per-sample padded rows.

Rolls out one GRPO batch on the calculator (its system prompt carries the tool schemas), then
times `train_on_batch` on that same batch with `trainer.shared_prefix` false and true (for each
`--row-tokens`, `trainer.prefix_row_tokens`), the paths alternating, and prints forwarded
positions, trained tokens and seconds per update (median, min, max). Every sample gets a non-zero advantage (+1 / -1 in turn), as if every group disagreed, so
the whole batch goes through forward and backward. Measures; asserts nothing.

    .venv/bin/python -m benchmarks.shared_prefix --model tiny --tasks 16 --rollouts 8
    .venv/bin/python -m benchmarks.shared_prefix --model smollm2-135m --lora --tasks 8 --rollouts 4
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from looprl.trainer.batch import Sample, samples_from_groups
from looprl.trainer.config import load_config
from looprl.trainer.trainer import Trainer
from looprl.trainer.update import train_on_batch


def rollout_batch(args: argparse.Namespace, out: Path) -> tuple[Trainer, list[Sample]]:
    """A set-up trainer and the samples of its first batch, each with a non-zero advantage."""
    cfg = load_config(
        None,
        {
            "model.name": args.model, "model.lora": args.lora, "trainer.steps": 1,
            "rollout.tasks_per_step": args.tasks, "rollout.rollouts_per_task": args.rollouts,
            "algorithm.updates_per_batch": args.updates, "run.tensorboard": False,
        },
    )  # fmt: skip
    trainer = Trainer(cfg, run_dir=out)
    trainer._setup()  # the trainer's own model, engine, renderer and update context
    groups, _seconds, _used = asyncio.run(trainer.collector.collect(1, 0))
    max_len = trainer.sampling.max_tokens * trainer.env.limits.max_turns
    samples, _stats = samples_from_groups(groups, trainer.algo, max_len)
    signs = [1.0 if i % 2 else -1.0 for i in range(len(samples))]
    return trainer, [
        dataclasses.replace(s, advantage=a) for s, a in zip(samples, signs, strict=True)
    ]


def main() -> None:
    """Parse arguments, roll out one batch, time the two update paths on it in turn."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--lora", action="store_true", help="train LoRA adapters instead of all weights")
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument(
        "--updates",
        type=int,
        default=1,
        help="algorithm.updates_per_batch (2+: an old-logprob pass)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed updates per path, alternating")
    p.add_argument("--row-tokens", type=int, nargs="+", default=[1024], help="prefix_row_tokens")
    args = p.parse_args()
    paths = [0, *args.row_tokens]  # 0: shared_prefix false
    seconds: dict[int, list[float]] = {n: [] for n in paths}
    stats: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trainer, samples = rollout_batch(args, Path(tmp) / "run")
        for _ in range(args.repeats + 1):  # the first round warms up
            for n in paths:
                ctx = dataclasses.replace(trainer.ctx, shared_prefix=n > 0, prefix_row_tokens=n)
                start = time.perf_counter()
                stats[n] = train_on_batch(ctx, samples)
                seconds[n].append(time.perf_counter() - start)
        asyncio.run(trainer.engine.close())
        trainer.env.close()
    print(f"{args.model}{' LoRA' if args.lora else ''}: {len(samples)} samples, "
          f"updates_per_batch {args.updates}, {args.repeats} timed updates per path")  # fmt: skip
    base = statistics.median(seconds[0][1:])
    for n in paths:
        s, t = stats[n], seconds[n][1:]
        name = f"prefix trees, rows of {n}" if n else "per-sample rows"
        print(
            f"{name:28} forwarded positions {s['forward_positions']:7.0f}"
            f"  trained tokens {s['train_tokens']:6.0f}"
            f"  ratio {s['forward_positions'] / s['train_tokens']:5.2f}"
            f"  update s {statistics.median(t):7.2f} [{min(t):.2f}-{max(t):.2f}]"
            f"  speed-up {base / statistics.median(t):.2f}x"
        )


if __name__ == "__main__":
    main()
