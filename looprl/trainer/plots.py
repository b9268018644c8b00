"""PNG plots of a run's curves (reward, eval, KL/entropy/clipping) and generic comparison plots.

`plot_run` follows the chart rules of `looprl view` (looprl/viewer/static/app.js): one panel per
namespace group; within a group, rates and fractions (every value in [0, 1]) share a panel with a
[0, 1] axis and each count (turns, tokens) gets its own panel, so no count flattens the rates;
the `reward/std` band is clipped to the range the rewards live in; a reward function equal to
`reward/mean` at every step (one function of weight 1) is drawn dashed over it, not hidden under it.

Figures are drawn with matplotlib's Agg canvas directly (no pyplot, no display, no global
state), and written to a temporary file that is renamed into place, so a viewer or a user
opening the PNG mid-training never sees a half-written image.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from looprl.trainer.logger import METRICS_FILE, read_metrics

PLOTS_DIR = "plots"
CURVES_FILE = "curves.png"
DIAGNOSTICS = (
    ("policy/kl", "KL to reference"),
    ("policy/entropy", "entropy"),
    ("policy/clip_frac", "clip fraction"),
)
MAX_SMOOTH_WINDOW = 25
COUNT_ABOVE = 1.5  # a series reaching |value| > 1.5 is a count (turns, tokens), as in the viewer
COLUMNS = 3  # panels per row below the reward panel


class Panel(NamedTuple):
    """One axis of `curves.png`: its title, the metric keys drawn on it, and whether they are all
    rates (values in [0, 1], drawn on a [0, 1] axis)."""

    title: str
    keys: tuple[str, ...]
    unit: bool


CURRICULUM = (  # drawn when the run has a curriculum or hints (looprl.trainer.curriculum)
    Panel("curriculum level", ("curriculum/level",), False),
    Panel("level pass rate, hint rate", ("curriculum/pass_rate", "curriculum/hint_rate"), True),
)


def plot_run(run_dir: str | Path) -> Path:
    """Draw `run_dir/metrics.jsonl` into `run_dir/plots/curves.png` and return its path.

    The top panel is the training reward: `reward/mean` (raw, smoothed, ± `reward/std` band) and
    each `reward/<fn>`. Below it, `plot_panels` decides the rest: the `eval/*` rates together and
    each `eval/*` count alone, then `policy/kl`, `policy/entropy`, `policy/clip_frac` one each.
    Missing keys, a single row and null/NaN values are all fine; an empty file gives a PNG
    that says so. A run written before the metric namespaces is read with its names renamed.
    """
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / METRICS_FILE)
    rest = plot_panels(rows)
    below = max(1, math.ceil(len(rest) / COLUMNS))
    fig = Figure(figsize=(11, 3.6 + 2.8 * below), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(1 + below, COLUMNS, height_ratios=[3.6] + [2.8] * below)
    fig.suptitle(f"{run_dir.resolve().name}: {len(rows)} logged steps")
    _reward_panel(fig.add_subplot(grid[0, :]), rows)
    if not rest:
        ax = fig.add_subplot(grid[1, :])
        _empty(ax, "no eval/* metrics logged yet")
        _finish(ax, "held-out evaluation", legend=False)
    for i, panel in enumerate(rest):
        _panel(fig.add_subplot(grid[1 + i // COLUMNS, i % COLUMNS]), rows, panel)
    out = run_dir / PLOTS_DIR / CURVES_FILE
    _save(fig, out)
    return out


def plot_panels(rows: Sequence[Mapping[str, Any]]) -> list[Panel]:
    """The panels below the reward panel: `eval/*` split into rates and counts, then the logged
    policy diagnostics (each on its own axis, as the viewer draws the `policy/` namespace), then
    the curriculum's level and its pass and hint rates when logged."""
    keys = sorted({k for r in rows for k in r if k.startswith("eval/")})
    values = {k: series(rows, k)[1] for k in keys}
    keys = [k for k in keys if len(values[k])]
    counts = [k for k in keys if np.max(np.abs(values[k])) > COUNT_ABOVE]
    rates = [k for k in keys if k not in counts]
    out = []
    if rates:  # beside counts, rates keep the whole [0, 1] in view (the viewer's "unit" charts)
        unit = bool(counts) and all(np.all((values[k] >= 0) & (values[k] <= 1)) for k in rates)
        out.append(Panel("held-out evaluation", tuple(rates), unit))
    out += [Panel(k, (k,), False) for k in counts]
    out += [Panel(t, (k,), False) for k, t in DIAGNOSTICS if len(series(rows, k)[0])]
    for title, wanted, unit in CURRICULUM:
        logged = tuple(k for k in wanted if len(series(rows, k)[0]))
        out += [Panel(title, logged, unit)] if logged else []
    return out


def band_limits(values: Sequence[np.ndarray]) -> tuple[float, float]:
    """Where a mean ± std band may reach, given the values drawn with it: [0, 1] when they all lie
    in [0, 1] (rewards, accuracies), [0, inf) when they are all >= 0, else unclipped."""
    flat = np.concatenate([np.asarray(v, dtype=float) for v in values]) if values else np.zeros(0)
    if not len(flat) or np.min(flat) < 0:
        return -math.inf, math.inf
    return 0.0, 1.0 if np.max(flat) <= 1 else math.inf


def plot_comparison(
    series_by_name: Mapping[str, Sequence[tuple[float, float]]],
    out: str | Path,
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    bands: Mapping[str, Sequence[tuple[float, float, float]]] | None = None,
) -> Path:
    """One line per name through its (x, y) points, e.g. accuracy vs step for each algorithm.

    `bands` optionally shades (x, low, high) around a named line (mean ± std over seeds).
    Non-finite points are skipped. Writes `out` atomically and returns it.
    """
    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, points in series_by_name.items():
        xs, ys = _finite_xy([p[0] for p in points], [p[1] for p in points])
        (line,) = ax.plot(xs, ys, marker="o" if len(xs) <= 30 else None, ms=3, lw=1.6, label=name)
        band = (bands or {}).get(name)
        if band:
            bx = np.array([b[0] for b in band], dtype=float)
            lo = np.array([b[1] for b in band], dtype=float)
            hi = np.array([b[2] for b in band], dtype=float)
            ok = np.isfinite(bx) & np.isfinite(lo) & np.isfinite(hi)
            ax.fill_between(bx[ok], lo[ok], hi[ok], color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _finish(ax, title, legend=bool(series_by_name))
    out = Path(out)
    _save(fig, out)
    return out


def series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one metric over the rows that hold a finite value for it."""
    pairs = [(r["step"], r[key]) for r in rows if key in r]
    xs, ys = _finite_xy([p[0] for p in pairs], [p[1] for p in pairs])
    order = np.argsort(xs, kind="stable")
    return xs[order], ys[order]


def smooth(values: np.ndarray, window: int | None = None) -> np.ndarray:
    """Trailing moving average (the first points average over what exists so far).

    The default window is a tenth of the series, between 1 and MAX_SMOOTH_WINDOW.
    """
    n = len(values)
    w = window if window is not None else max(1, min(MAX_SMOOTH_WINDOW, n // 10))
    if n == 0 or w <= 1:
        return values.astype(float)
    csum = np.cumsum(np.insert(values.astype(float), 0, 0.0))
    idx = np.arange(1, n + 1)
    lo = np.maximum(idx - w, 0)
    return (csum[idx] - csum[lo]) / (idx - lo)


def _reward_panel(ax: Axes, rows: Sequence[Mapping[str, Any]]) -> None:
    xs, ys = series(rows, "reward/mean")
    fns = sorted(
        {k for r in rows for k in r if k.startswith("reward/")} - {"reward/mean", "reward/std"}
    )
    fn_series = {k: series(rows, k) for k in fns}
    if len(xs):
        sx, sd = series(rows, "reward/std")
        if len(sx) == len(xs) and np.array_equal(sx, xs):
            lo, hi = band_limits([ys, *(v[1] for v in fn_series.values())])
            band = (np.maximum(ys - sd, lo), np.minimum(ys + sd, hi))
            ax.fill_between(xs, *band, color="C0", alpha=0.12, lw=0, label="± std")
        _line(ax, xs, ys, label="reward/mean", smoothed=True, color="C0")
    for i, key in enumerate(fns):
        fx, fy = fn_series[key]
        if len(fx) and np.array_equal(fx, xs) and np.allclose(fy, ys, rtol=0, atol=1e-9):
            ax.plot(fx, fy, "--", lw=1.8, color=f"C{i + 1}", label=f"{key} (= reward/mean)")
            continue
        _line(ax, fx, fy, label=key, color=f"C{i + 1}", lw=1.0, alpha=0.8)
    if not len(xs) and not fns:
        _empty(ax, "no reward/* metrics logged yet")
    ax.set_ylabel("reward")
    _finish(ax, "training reward", legend=bool(len(xs) or fns))


def _panel(ax: Axes, rows: Sequence[Mapping[str, Any]], panel: Panel) -> None:
    """One panel of `plot_panels`: eval series with markers, a diagnostic smoothed, the
    curriculum's series raw."""
    for i, key in enumerate(panel.keys):
        if key.startswith("eval/"):
            ax.plot(*series(rows, key), marker="o", ms=4, lw=1.5, color=f"C{i}", label=key)
        else:
            smooth = not key.startswith("curriculum/")  # a level is a step function
            _line(ax, *series(rows, key), label=key, smoothed=smooth, color=f"C{i}")
    if panel.unit:
        ax.set_ylim(-0.05, 1.05)
    ax.margins(x=0.04)
    _finish(ax, panel.title, legend=len(panel.keys) > 1)


def _line(
    ax: Axes,
    xs: np.ndarray,
    ys: np.ndarray,
    *,
    label: str,
    smoothed: bool = False,
    color: str | None = None,
    lw: float = 1.6,
    alpha: float = 1.0,
) -> None:
    """Values as a line (markers when few); with `smoothed`, thin raw plus a bold smoothed line."""
    if not len(xs):
        return
    marker = "o" if len(xs) <= 20 else None
    if smoothed and len(xs) >= 10:
        (raw,) = ax.plot(xs, ys, lw=0.8, alpha=0.35, marker=marker, ms=3, color=color, label=label)
        ax.plot(xs, smooth(ys), lw=2.0, color=raw.get_color(), label="smoothed")
    else:
        ax.plot(xs, ys, marker=marker, ms=3, lw=lw, alpha=alpha, color=color, label=label)


def _finish(ax: Axes, title: str, *, legend: bool) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=8, loc="best")


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def _finite_xy(xs: Sequence[Any], ys: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    keep = [
        (float(x), float(y))
        for x, y in zip(xs, ys, strict=True)
        if _is_num(x) and _is_num(y) and math.isfinite(float(x)) and math.isfinite(float(y))
    ]
    if not keep:
        return np.zeros(0), np.zeros(0)
    arr = np.array(keep, dtype=float)
    return arr[:, 0], arr[:, 1]


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _save(fig: Figure, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        fig.savefig(tmp, format="png", dpi=110)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
