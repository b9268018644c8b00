"""The same GRPO step on a git ref's code and on the working tree, interleaved: pairwise ratios.

`benchmarks.train_step --compare-ref REF` lands here. REF's tree is exported with `git archive`
into a temporary folder (no worktree, no checkout: the repository is left as it is), then each
round runs `python -m looprl train` once on each code, alternating which goes first, in a fresh
process with `PYTHONPATH` set to that code, so both see the same machine state as nearly as two
runs in a row can. A step's seconds are the differences of the consecutive `wall_time`s in
`metrics.jsonl` (the first step, which warms caches up, is left out), a key both old and new runs
write. Forwarded positions and trained tokens are read under either metric name where present.
Measures and prints; asserts nothing.

    .venv/bin/python -m benchmarks.train_step --compare-ref 324bd95 --models smollm2-135m --lora \\
        --tasks 8 --rollouts 4 --steps 3 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
POSITIONS = ("train/forward_positions", "forward_positions")
"""The forwarded-positions metric, under its name now and before the metric namespaces."""
TOKENS = ("train/tokens", "train_tokens")
"""The trained-tokens metric, likewise."""


@dataclass
class StepTimes:
    """One run's steps after the first: seconds each, forwarded positions and trained tokens."""

    seconds: list[float]
    positions: list[float]
    tokens: list[float]


def export_ref(ref: str, dest: Path) -> Path:
    """REF's tracked files, unpacked into `dest` (`git archive`; nothing in the repository moves)."""
    archive = dest / "ref.tar"
    done = subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), ref], cwd=ROOT, capture_output=True
    )
    if done.returncode:
        raise SystemExit(f"error: git archive {ref} failed: {done.stderr.decode().strip()}")
    code = dest / "ref"
    with tarfile.open(archive) as tar:
        tar.extractall(code, filter="data")
    return code


def train_args(model: str, args: argparse.Namespace) -> list[str]:
    """`looprl train` flags of the step: the same on both codes (each has had them all along)."""
    return [
        "--model.name", model, "--model.lora", str(args.lora).lower(),
        "--trainer.steps", str(args.steps), "--trainer.eval_every", "0",
        "--trainer.eval_tasks", "1", "--trainer.save_every", str(args.steps),
        "--trainer.save_rollouts", "0", "--rollout.tasks_per_step", str(args.tasks),
        "--rollout.rollouts_per_task", str(args.rollouts), "--run.tensorboard", "false",
    ]  # fmt: skip


def run_on(code: Path, run_dir: Path, flags: list[str]) -> StepTimes:
    """Train with the looprl found in `code`; the steps' times from its metrics."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, "-m", "looprl", "train", "--run-dir", str(run_dir), *flags]
    done = subprocess.run(cmd, cwd=code, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"error: looprl train on {code} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return step_times(rows)


def step_times(rows: list[dict]) -> StepTimes:
    """Seconds of each step after the first (wall_time differences) and its sizes."""
    walls = [float(r["wall_time"]) for r in rows]
    later = rows[1:]

    def first_of(names: tuple[str, ...], row: dict) -> float:
        return float(next((row[n] for n in names if n in row), float("nan")))

    return StepTimes(
        seconds=[b - a for a, b in zip(walls, walls[1:], strict=False)],
        positions=[first_of(POSITIONS, r) for r in later],
        tokens=[first_of(TOKENS, r) for r in later],
    )


def compare(ref: str, model: str, args: argparse.Namespace) -> Table:
    """`args.rounds` interleaved rounds of REF and the working tree; one row per round + median."""
    if args.steps < 2:
        raise SystemExit("error: --compare-ref needs --steps 2 or more (the first step warms up)")
    flags = train_args(model, args)
    table = Table(
        title=f"GRPO step, {ref} vs working tree: {model}{' LoRA' if args.lora else ''}, "
        f"{args.tasks} tasks x {args.rollouts} rollouts, {args.steps - 1} timed step(s) a run, "
        f"load {os.getloadavg()[0]:.1f} at start"
    )
    for col in ("round", f"{ref} s/step", "tree s/step", "speed-up", f"{ref} positions/token",
                "tree positions/token"):  # fmt: skip
        table.add_column(col, justify="right")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        codes = {"ref": export_ref(ref, Path(tmp)), "tree": ROOT}
        for i in range(args.rounds):
            order = ("ref", "tree") if i % 2 == 0 else ("tree", "ref")
            got = {k: run_on(codes[k], Path(tmp) / f"{k}-{i}", flags) for k in order}
            old, new = (statistics.median(got[k].seconds) for k in ("ref", "tree"))
            ratios.append(old / new)
            table.add_row(
                str(i + 1), f"{old:.2f}", f"{new:.2f}", f"{old / new:.2f}x",
                per_token(got["ref"]), per_token(got["tree"]),
            )  # fmt: skip
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
    table.add_row("median", "", "", f"{statistics.median(ratios):.2f}x ({spread})", "", "")
    return table


def per_token(times: StepTimes) -> str:
    """Forwarded positions per trained token (median over steps), or `-` when not recorded."""
    ratios = [p / t for p, t in zip(times.positions, times.tokens, strict=False) if t > 0]
    ratios = [r for r in ratios if r == r]  # NaN: the run did not record one of the two
    return f"{statistics.median(ratios):.2f}" if ratios else "-"
