"""PNG plots of a run's curves (reward, eval, KL/entropy/clipping) and generic comparison plots.

Figures are drawn with matplotlib's Agg canvas directly (no pyplot, no display, no global
state), and written to a temporary file that is renamed into place, so a viewer or a user
opening the PNG mid-training never sees a half-written image.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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


def plot_run(run_dir: str | Path) -> Path:
    """Draw `run_dir/metrics.jsonl` into `run_dir/plots/curves.png` and return its path.

    Panel 1: `reward/mean` (raw, smoothed, ± `reward/std` band) and each `reward/<fn>`.
    Panel 2: every `eval/*` series against step (values outside [0, 1] on a right-hand axis).
    Panel 3: `policy/kl`, `policy/entropy`, `policy/clip_frac`, one small axis each, when logged.
    Missing keys, a single row and null/NaN values are all fine; an empty file gives a PNG
    that says so. A run written before the metric namespaces is read with its names renamed.
    """
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / METRICS_FILE)
    diagnostics = [(k, t) for k, t in DIAGNOSTICS if len(series(rows, k)[0])]
    fig = Figure(figsize=(11, 9.5 if diagnostics else 7), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(3 if diagnostics else 2, 1)
    fig.suptitle(f"{run_dir.resolve().name}: {len(rows)} logged steps")
    _reward_panel(fig.add_subplot(grid[0]), rows)
    _eval_panel(fig.add_subplot(grid[1]), rows)
    if diagnostics:
        cells = grid[2].subgridspec(1, len(diagnostics))
        for i, (key, title) in enumerate(diagnostics):
            ax = fig.add_subplot(cells[0, i])
            _line(ax, *series(rows, key), label=key, smoothed=True)
            _finish(ax, title, legend=False)
    out = run_dir / PLOTS_DIR / CURVES_FILE
    _save(fig, out)
    return out


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
    if len(xs):
        sx, sd = series(rows, "reward/std")
        if len(sx) == len(xs) and np.array_equal(sx, xs):
            ax.fill_between(xs, ys - sd, ys + sd, color="C0", alpha=0.12, lw=0, label="± std")
        _line(ax, xs, ys, label="reward/mean", smoothed=True, color="C0")
    fns = sorted(
        {k for r in rows for k in r if k.startswith("reward/")} - {"reward/mean", "reward/std"}
    )
    for i, key in enumerate(fns):
        _line(ax, *series(rows, key), label=key, color=f"C{i + 1}", lw=1.0, alpha=0.8)
    if not len(xs) and not fns:
        _empty(ax, "no reward/* metrics logged yet")
    ax.set_ylabel("reward")
    _finish(ax, "training reward", legend=bool(len(xs) or fns))


def _eval_panel(ax: Axes, rows: Sequence[Mapping[str, Any]]) -> None:
    keys = sorted({k for r in rows for k in r if k.startswith("eval/")})
    data = {k: series(rows, k) for k in keys}
    data = {k: v for k, v in data.items() if len(v[0])}
    if not data:
        _empty(ax, "no eval/* metrics logged yet")
        _finish(ax, "held-out evaluation", legend=False)
        return
    unit = {k for k, (_, y) in data.items() if np.all((y >= 0) & (y <= 1))}
    right = ax.twinx() if len(unit) < len(data) and unit else None
    for i, (key, (x, y)) in enumerate(data.items()):
        target = right if right is not None and key not in unit else ax
        style = "--" if target is right else "-"
        target.plot(x, y, style, marker="o", ms=4, lw=1.5, color=f"C{i}", label=key)
    handles, labels = ax.get_legend_handles_labels()
    if right is not None:
        more = right.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
        right.set_ylabel("other eval metrics (dashed)")
    ax.set_ylabel("fraction" if unit else "value")
    _finish(ax, "held-out evaluation", legend=False)
    ax.legend(handles, labels, fontsize=8, loc="best")


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
