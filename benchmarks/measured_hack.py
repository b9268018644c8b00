"""A reward hack measured end to end: probe it, watch GRPO learn it, see the monitors trip.

The toy `number_anywhere` pays when the right sum appears anywhere in the reply; its sound twin
`number_final` pays only for exactly one `<answer>` holding it (each logs the other's reward as
a zero-weight metric, so both runs show the true accuracy beside the reward they optimise).
Stages (each skipped when its output exists, so a stopped run continues):

1. SFT warm start: an imperfect adder of 1..12 (50% right, 30% a slip of 1-2, 20% a hedge
   `<answer>SLIP</answer> or SUM`: the hedge is how real models first game such a reward);
2. `looprl probe` on both environments (the gameable one must be flagged before training);
3. GRPO from the same SFT model on each (two processes, one torch thread each);
4. the plot (training reward and true accuracy, reply length, monitor trips) and a summary:
   first trip of each monitor, reward and accuracy by window, sample replies.

    .venv/bin/python benchmarks/measured_hack.py --out runs/hack     # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOOPRL = [sys.executable, "-m", "looprl"]
ENVS = ("number_anywhere", "number_final")
OPERANDS = {"low": 1, "high": 12}


def sft_rows(n: int) -> list[dict[str, Any]]:
    """`n` warm-start conversations over the train split (see the module docstring)."""
    from looprl.envs.hackable import SYSTEM_PROMPT, generate_tasks

    rng = random.Random(0)
    pool = generate_tasks("train", 1000, seed=123, **OPERANDS)
    rows = []
    for i in range(n):
        task = pool[i % len(pool)]
        total = int(task.answer or 0)
        slip = total + rng.choice([-2, -1, 1, 2])
        u = rng.random()
        reply = (
            f"<answer>{total}</answer>" if u < 0.5
            else f"<answer>{slip}</answer>" if u < 0.8
            else f"<answer>{slip}</answer> or {total}"
        )  # fmt: skip
        turns = [("system", SYSTEM_PROMPT), ("user", task.prompt[0].content), ("assistant", reply)]
        rows.append({"messages": [{"role": r, "content": c} for r, c in turns]})
    return rows


def run(cmd: list[str], log: Path) -> subprocess.Popen:
    """Start `cmd` with one torch thread, its output to `log`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print("$", " ".join(cmd[2:]), f"> {log}", flush=True)
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def train_cmd(env: str, model: Path, out: Path, steps: int) -> list[str]:
    """The `looprl train` command of one environment's GRPO run."""
    return [*LOOPRL, "train", "--model.name", str(model), "--env.name", env,
            "--env.kwargs", json.dumps(OPERANDS), "--rollout.tasks_per_step", "16",
            "--rollout.rollouts_per_task", "8", "--optim.lr", "1e-4", "--optim.warmup_steps", "2",
            "--trainer.steps", str(steps), "--trainer.eval_every", "5",
            "--trainer.eval_before", "true", "--trainer.eval_tasks", "64",
            "--trainer.save_every", str(steps), "--trainer.save_rollouts", "128",
            "--monitors.heldout_metric", "eval/correct_final",
            "--run.output_dir", str(out / "runs"), "--run.name", env]  # fmt: skip


def stages(args: argparse.Namespace) -> None:
    """Run every stage whose output is missing."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model = out / "sft_model"
    if not (model / "config.json").exists():
        data = out / "sft.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in sft_rows(args.sft_rows)))
        sft = [*LOOPRL, "sft", "--data", str(data), "--output", str(model), "--epochs",
               str(args.sft_epochs), "--batch-size", "32"]  # fmt: skip
        if run(sft, out / "sft.log").wait():
            raise SystemExit(f"SFT failed: see {out / 'sft.log'}")
    for env in ENVS:
        probe_dir = out / f"probe-{env}"
        if not (probe_dir / "probe.json").exists():
            cmd = [*LOOPRL, "probe", env, "--env.low", "1", "--env.high", "12", "--out",
                   str(probe_dir)]  # fmt: skip
            run(cmd, out / f"probe-{env}.log").wait()  # exit 1 under --strict only
    jobs = []
    for env in ENVS:
        if not (out / "runs" / env / "final").exists():
            jobs.append(run(train_cmd(env, model, out, args.steps), out / f"{env}.log"))
    if any(job.wait() for job in jobs):
        raise SystemExit(f"a training run failed: see the logs in {out}")


def main(argv: list[str] | None = None) -> None:
    """Run (or continue) the experiment, then plot and summarise it."""
    from benchmarks.measured_hack_report import plot, summary

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/hack"))
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--sft-rows", type=int, default=1000)
    p.add_argument("--sft-epochs", type=float, default=6)
    p.add_argument("--quick", action="store_true", help="a smoke test: 64 rows, 1 epoch, 2 steps")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.sft_rows, args.sft_epochs = 2, 64, 1.0
    stages(args)
    print(summary(args.out, ENVS))
    print(f"plot: {plot(args.out, ENVS)}")


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    main()
