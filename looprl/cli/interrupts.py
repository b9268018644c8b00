"""Ctrl-C in `looprl eval`, `looprl train` and `looprl sft`: what was kept, and how to go on.

Each function turns the interruption of one command into an `Interrupted` (`what` was kept —
the command that resumes it), which `looprl.cli.main` prints as one line before exiting 130.
The resume command is the one the user typed, with `--resume` (and the directory that was
chosen for them) added.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from looprl.cli.fields import Interrupted


def _again(argv: list[str], *extra: str) -> str:
    """`looprl ARGV EXTRA`, quoted for a shell, leaving out what ARGV already holds."""
    words = ["looprl", *argv]
    i = 0
    while i < len(extra):  # a flag, with its value when the next item is not a flag
        flag = extra[i]
        takes = i + 1 < len(extra) and not extra[i + 1].startswith("--")
        if flag not in argv:
            words += [flag, extra[i + 1]] if takes else [flag]
        i += 2 if takes else 1
    return shlex.join(words)


def eval_interrupted(argv: list[str], output: Path) -> Interrupted:
    """`looprl eval` stopped: the episodes kept in `output` and the command that resumes it."""
    if not (output / "metadata.json").is_file():
        return Interrupted("the evaluation stopped before it wrote anything", "rerun the command")
    results = output / "results.jsonl"
    kept = sum(1 for _ in results.open("rb")) if results.is_file() else 0
    return Interrupted(
        f"{kept} episodes kept in {results} (its metadata.json says interrupted)",
        f"resume with: {_again(argv, '--output', str(output), '--resume')}",
    )


def train_interrupted(argv: list[str], run_dir: Path) -> Interrupted:
    """`looprl train` stopped: the run's last checkpoint and the command that resumes from it."""
    from looprl.trainer.checkpoint.files import latest_checkpoint

    again = _again(argv, "--resume", "--run-dir", str(run_dir))
    last = latest_checkpoint(run_dir)
    if last is None:
        return Interrupted(
            f"the run {run_dir} stopped before its first checkpoint", f"start it again: {again}"
        )
    return Interrupted(
        f"the run {run_dir} stopped; its last checkpoint is {last.name}",
        f"resume with: {again}",
    )


def sft_interrupted(output: Path) -> Interrupted:
    """`looprl sft` stopped: `output` is untouched (the model is written only at the end)."""
    state = "left as it was" if output.exists() else "not created"
    return Interrupted(f"fine-tuning stopped; {output} was {state}", "rerun the command")
