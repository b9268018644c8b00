"""Console output: summary tables and progress bars (Rich)."""

from __future__ import annotations

import math
import os
import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

if TYPE_CHECKING:
    from looprl.types import Summary

LINE_WIDTH = 120
"""Columns of looprl's console lines, and the width used when the output is not a terminal."""


def _width() -> int | None:
    """None (the terminal's width) on a terminal; else `$COLUMNS` or LINE_WIDTH, not Rich's 80.

    A log file or a pipe has no width; Rich would wrap at 80 columns, cutting paths and the
    120-column step lines in two.
    """
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return None
    return LINE_WIDTH


console = Console(width=_width())
"""The console every looprl command prints to (stdout)."""


def progress_bar() -> Progress:
    """A Rich progress bar for episodes (count, elapsed, remaining)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
    )


def _fmt(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def summary_table(summary: Summary, title: str = "Evaluation") -> Table:
    """A two-column table of an evaluation summary from `looprl.eval.summary.summarize`."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("episodes (scored)", f"{summary['episodes']} ({summary['scored_episodes']})")
    table.add_row("reward", f"{_fmt(summary['reward_mean'])} ± {_fmt(summary['reward_std'])}")
    for name, value in summary["rewards"].items():
        table.add_row(f"  {name}", _fmt(value))
    for name, value in summary["pass_at_k"].items():
        table.add_row(name, _fmt(value))
    for env_name, row in summary.get("per_env", {}).items():
        table.add_row(
            f"[{env_name}] reward",
            f"{_fmt(row.get('reward', float('nan')))} ({row['episodes']} episodes)",
        )
        for name, value in row.get("rewards", {}).items():
            table.add_row(f"[{env_name}]   {name}", _fmt(value))
    table.add_row("turns / episode", _fmt(summary["turns_mean"]))
    table.add_row("tool calls / episode", _fmt(summary["tool_calls_mean"]))
    errors = summary["tool_errors"]
    table.add_row("tool errors", ", ".join(f"{k}={v}" for k, v in errors.items()) or "none")
    table.add_row("truncated", str(summary["truncated"]))
    table.add_row("rollout errors", str(summary["rollout_errors"]))
    if summary.get("infra_errors"):
        table.add_row("  of which infrastructure", str(summary["infra_errors"]))
    table.add_row("scoring errors", str(summary["scoring_errors"]))
    if summary.get("template_breaks"):
        table.add_row("template breaks", str(summary["template_breaks"]))
    table.add_row("generated tokens / episode", _fmt(summary["generated_tokens_mean"]))
    if "tokens_per_second" in summary:
        table.add_row("generated tokens / s", f"{summary['tokens_per_second']:.1f}")
    return table


def print_summary(summary: Summary, title: str = "Evaluation") -> None:
    """Print the summary table, then the most common error messages if any."""
    console.print(summary_table(summary, title))
    for msg in summary.get("error_messages", []):
        console.print(f"[red]error[/red] {msg}")
