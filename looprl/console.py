"""Console output: summary tables; progress as a Rich bar on a terminal, plain lines in a log."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
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


class ProgressLines:
    """Plain progress lines for a log, where a Rich bar prints nothing until it ends.

    `advance(n, info)` counts `n` more items done; a line such as
    `eval: 10/40 episodes, reward 0.350, 12 s` is printed when about a tenth of `total` more is
    done or `interval_s` seconds have passed since the last line, whichever comes first, and
    when the count reaches `total`.
    """

    def __init__(
        self,
        label: str,
        total: int,
        *,
        unit: str = "episodes",
        interval_s: float = 30.0,
        out: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.every = max(1, -(-total // 10))  # ceil(total / 10): about every 10 %
        self.interval_s = interval_s
        self.out = out or console
        self.clock = clock
        self.done = 0
        self._start = self._last_time = clock()
        self._last_done = 0
        self._info = ""

    def advance(self, n: int, info: str = "") -> None:
        """Count `n` more items; print a line when one is due (see the class doc)."""
        self.done += n
        now = self.clock()
        due = self.done - self._last_done >= self.every or now - self._last_time >= self.interval_s
        self._info = info
        if due or self.done >= self.total:
            self._line(now)

    def finish(self) -> None:
        """Print the last count if its line is not out yet (a resumed run never reaches `total`)."""
        if self.done != self._last_done:
            self._line(self.clock())

    def _line(self, now: float) -> None:
        self._last_done, self._last_time = self.done, now
        parts = [f"{self.label}: {self.done}/{self.total} {self.unit}"]
        parts += [self._info] if self._info else []
        parts.append(f"{now - self._start:.0f} s")
        self.out.print(", ".join(parts), highlight=False, markup=False, soft_wrap=True)


@contextlib.contextmanager
def progress(
    label: str, total: int, *, unit: str = "episodes"
) -> Iterator[Callable[[int, str], None]]:
    """Report progress on `total` items: a Rich bar on a terminal, `ProgressLines` otherwise.

    Yields `advance(n, info)`; on a normal exit the bar is shown complete (a resumed run's kept
    items were never advanced).
    """
    if not console.is_terminal:
        lines = ProgressLines(label, total, unit=unit)
        yield lines.advance
        lines.finish()
        return
    with progress_bar() as bar:
        task = bar.add_task(unit, total=total, info="")
        yield lambda n, info: bar.update(task, advance=n, info=info)
        bar.update(task, completed=total)


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
    if "prompt_tokens" in summary:
        table.add_row("prompt tokens (server count)", str(summary["prompt_tokens"]))
    if "tokens_per_second" in summary:
        table.add_row("generated tokens / s", f"{summary['tokens_per_second']:.1f}")
    return table


def print_summary(summary: Summary, title: str = "Evaluation") -> None:
    """Print the summary table, then the most common error messages if any."""
    console.print(summary_table(summary, title))
    for msg in summary.get("error_messages", []):
        console.print(f"[red]error[/red] {msg}")
