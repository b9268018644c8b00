"""Error bars for held-out evaluations: Wilson intervals, bootstrap means, the trainer's stored evals."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path
from typing import Any


def wilson(wins: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a rate (sound at 0 and at n)."""
    if n == 0:
        return (0.0, 1.0)
    p = wins / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_mean(
    values: list[float], draws: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """The mean of `values` and its percentile bootstrap 95% interval (resampling the values).

    Give one value per independent unit: per question (its samples averaged), or per paired
    difference, so repeated samples of one question do not pass for independent evidence.
    """
    if not values:
        raise ValueError("bootstrap_mean needs at least one value")
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(draws))
    return statistics.fmean(values), means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def stored_evals(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """The trainer's held-out evaluations of a run: step -> rows of `eval/step_*/results.jsonl`."""
    found = {}
    for path in sorted(run_dir.glob("eval/step_*/results.jsonl")):
        rows = [json.loads(line) for line in path.read_text("utf-8").splitlines() if line]
        found[int(path.parent.name.removeprefix("step_"))] = rows
    if not found:
        raise SystemExit(f"{run_dir}: no eval/step_*/results.jsonl (was the run evaluated?)")
    return found


def training_curve(run_dir: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) of one training metric from the run's metrics.jsonl (rows lacking it skipped)."""
    from looprl.trainer.logger import METRICS_FILE, read_metrics

    return [(r["step"], r[key]) for r in read_metrics(run_dir / METRICS_FILE) if key in r]


def finish_plot(fig: Any, ax: Any, out: Path, *, ylabel: str, title: str) -> Path:
    """A held-out-rate plot's common finish: axes on [0, 1], grid, legend, saved as a PNG at `out`."""
    import matplotlib.pyplot as plt

    ax.set(xlabel="GRPO step", ylabel=ylabel, ylim=(0, 1.05), title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def print_paired_change(
    what: str, first: int, last: int, change: tuple[float, float, float], unit: str
) -> None:
    """Print a first-to-last change with its interval, e.g. `win rate change, step 0 -> 40 ...`."""
    gain, low, high = change
    print(
        f"\n{what} change, step {first} -> {last} (paired, {unit}): {gain:+.3f} [{low:+.3f}, {high:+.3f}]"
    )
