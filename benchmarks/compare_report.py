"""What the comparison scripts report: per-run statistics, per-group means, the table and the plots.

A run's rows are its `metrics.jsonl`. From them: held-out accuracy at the start (the step-0
evaluation) and at the end, the first step and wall-clock second at which it reached a target,
the mean clip fractions (`policy/clip_frac`, `_low`, `_high`), the sampler/trainer gap
(`policy/logprob_gap`: mean |trainer - sampler| logprob on trained tokens; `policy/mismatch_kl`),
the mean `rollout/staleness` (to confirm the regime ran as asked), and a collapse flag:

- `accuracy`: the final held-out accuracy ended more than `margin` below its best (start
  included: a run that climbs and then falls back to where it began has collapsed too), or at
  zero when some evaluation was above zero (a run that starts low and falls to nothing at once);
- `entropy`: the policy's entropy (`policy/entropy`) over the last 3 steps fell below `entropy_ratio` times its
  mean over the first 3 (the model stopped exploring).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.trainer.plots import plot_comparison

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class RunStats:
    """The numbers one run contributes to its group's row."""

    start: float | None
    final: float | None
    reach_step: int | None
    reach_seconds: float | None
    clip_frac: float | None
    clip_frac_low: float | None
    clip_frac_high: float | None
    logprob_gap: float | None
    mismatch_kl: float | None
    staleness: float | None
    seconds: float
    collapse: str
    """"" (none), "accuracy", "entropy" or "accuracy+entropy" """


def curve(rows: Rows, key: str) -> list[tuple[int, float, float]]:
    """(step, wall seconds, value) of every row that holds `key`."""
    return [(r["step"], r.get("wall_time", 0.0), r[key]) for r in rows if r.get(key) is not None]


def _mean_of(rows: Rows, key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None and r["step"] > 0]
    return statistics.fmean(values) if values else None


def run_stats(
    rows: Rows, key: str, target: float, *, margin: float = 0.1, entropy_ratio: float = 0.25
) -> RunStats:
    """A run's statistics (see the module docstring for the collapse rule)."""
    acc = curve(rows, key)
    start, final = (acc[0][2], acc[-1][2]) if acc else (None, None)
    reach = next(((s, w) for s, w, v in acc if v >= target), (None, None))
    entropy = [r["policy/entropy"] for r in rows if r.get("policy/entropy") is not None]
    flags = []
    best = max((v for _, _, v in acc), default=0.0)
    if final is not None and (final < best - margin or (final == 0 < best)):  # fell from its best
        flags.append("accuracy")
    if len(entropy) >= 6 and statistics.fmean(entropy[-3:]) < entropy_ratio * statistics.fmean(
        entropy[:3]
    ):
        flags.append("entropy")
    return RunStats(
        start=start,
        final=final,
        reach_step=reach[0],
        reach_seconds=reach[1],
        clip_frac=_mean_of(rows, "policy/clip_frac"),
        clip_frac_low=_mean_of(rows, "policy/clip_frac_low"),
        clip_frac_high=_mean_of(rows, "policy/clip_frac_high"),
        logprob_gap=_mean_of(rows, "policy/logprob_gap"),
        mismatch_kl=_mean_of(rows, "policy/mismatch_kl"),
        staleness=_mean_of(rows, "rollout/staleness"),
        seconds=max((r.get("wall_time", 0.0) for r in rows), default=0.0),
        collapse="+".join(flags),
    )


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def group_cells(stats: Sequence[RunStats]) -> dict[str, str]:
    """One table row's cells from a group's runs (one per seed)."""
    finals = [s.final for s in stats if s.final is not None]
    reached = [s for s in stats if s.reach_step is not None]
    n = len(stats)
    clip = _mean([s.clip_frac for s in stats])
    low, high = _mean([s.clip_frac_low for s in stats]), _mean([s.clip_frac_high for s in stats])
    collapsed = [s.collapse for s in stats if s.collapse]
    return {
        "final": (
            f"{statistics.fmean(finals):.3f} ± {statistics.pstdev(finals):.3f}" if finals else "-"
        ),
        "steps": (
            f"{statistics.fmean(s.reach_step or 0 for s in reached):.1f} ({len(reached)}/{n})"
            if reached
            else f"never (0/{n})"
        ),
        "seconds": (
            f"{statistics.fmean(s.reach_seconds or 0.0 for s in reached):.0f}" if reached else "-"
        ),
        "clip": f"{_fmt(clip)} ({_fmt(low)} / {_fmt(high)})",
        "gap": _fmt(_mean([s.logprob_gap for s in stats]), 4),
        "collapse": f"{len(collapsed)}/{n}"
        + (f" ({', '.join(sorted(set(collapsed)))})" if collapsed else ""),
    }


def markdown_table(groups: Mapping[tuple[str, str], Sequence[RunStats]], target: float) -> str:
    """The results table for docs/results.md: one row per (preset, regime)."""
    head = (
        "| preset | regime | final held-out acc (mean ± std) | steps to "
        f"{target} (reached) | seconds to {target} | clip frac (low / high) | sampler-trainer "
        "gap | collapse |"
    )
    lines = [head, "|" + "---|" * 8]
    for (preset, regime), stats in groups.items():
        c = group_cells(stats)
        lines.append(
            f"| {preset} | {regime} | {c['final']} | {c['steps']} | {c['seconds']} | "
            f"{c['clip']} | {c['gap']} | {c['collapse']} |"
        )
    return "\n".join(lines)


def mean_curves(
    runs: Mapping[str, Sequence[Rows]], key: str, x: str
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[tuple[float, float, float]]]]:
    """Per name: the mean curve over its runs, x = eval step or mean wall seconds ("step"/"wall"),
    and its ± std band, for `plot_comparison`."""
    series: dict[str, list[tuple[float, float]]] = {}
    bands: dict[str, list[tuple[float, float, float]]] = {}
    for name, group in runs.items():
        by_step: dict[int, list[tuple[float, float]]] = {}
        for rows in group:
            for step, wall, value in curve(rows, key):
                by_step.setdefault(step, []).append((wall, value))
        points = []
        for step, pairs in sorted(by_step.items()):
            xs = step if x == "step" else statistics.fmean(w for w, _ in pairs)
            values = [v for _, v in pairs]
            points.append((float(xs), statistics.fmean(values), statistics.pstdev(values)))
        series[name] = [(px, m) for px, m, _ in points]
        bands[name] = [(px, m - sd, m + sd) for px, m, sd in points]
    return series, bands


def plot_metric(
    runs: Mapping[str, Sequence[Rows]],
    key: str,
    out: Path,
    title: str,
    ylabel: str = "held-out accuracy",
    xs: Sequence[str] = ("step", "wall"),
) -> list[Path]:
    """Plots of `key` (held-out accuracy unless told; mean ± std over seeds), one per x axis:
    against steps ("step"), against seconds ("wall")."""
    paths = []
    for x in xs:
        series, bands = mean_curves(runs, key, x)
        paths.append(
            plot_comparison(
                series,
                out.with_name(f"{out.stem}-{x}.png"),
                f"{title} (mean ± std over seeds)",
                "step" if x == "step" else "wall-clock seconds",
                ylabel,
                bands=bands,
            )
        )
    return paths
