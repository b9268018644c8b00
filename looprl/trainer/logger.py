"""Training metrics to `metrics.jsonl`, TensorBoard and one Rich console line per step; rollout dumps.

Metric keys are declared once, in `looprl.trainer.metrics.METRICS` (listed in docs/metrics.md);
the logger writes whatever it is given, and a test holds the trainer to that vocabulary.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from looprl.files import write_text_atomically
from looprl.types import EpisodeResult

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
ROLLOUTS_DIR = "rollouts"
RESERVED = ("step", "wall_time")
_ROLLOUT_FILE = re.compile(r"^step_(\d+)\.jsonl$")

# (key, console label, format) of the metrics shown on the console line, in order.
_CONSOLE_METRICS: tuple[tuple[str, str, str], ...] = (
    ("loss", "loss", "{:+.4f}"),
    ("kl", "kl", "{:.2e}"),
    ("mismatch_kl", "mkl", "{:.1e}"),
    ("entropy", "ent", "{:.3f}"),
    ("clip_frac", "clip", "{:.3f}"),
    ("zero_var_frac", "0var", "{:.2f}"),
    ("grad_norm", "gnorm", "{:.3f}"),
    ("lr", "lr", "{:.1e}"),
    ("tokens_per_s", "tok/s", "{:.0f}"),
)
_TIMES = (("generate", "gen"), ("score", "score"), ("train", "train"), ("sync", "sync"))


class MetricsLogger:
    """Appends one JSON line per step to `run_dir/metrics.jsonl`, mirrors to TensorBoard and console.

    A new run (`resume_step=None`) refuses to append to an existing non-empty `metrics.jsonl`
    (two runs mixed in one file would be unreadable). `resume_step=N` continues a run from its
    checkpoint at step N: lines with step > N (logged after the checkpoint by a run that was
    then killed) are removed, as are their rollout files and TensorBoard events, and
    `wall_time` continues from the last kept line. `console` may be a Rich `Console` to print to.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        console: bool | Console = True,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._time_offset = 0.0
        if resume_step is None:
            if self.path.is_file() and self.path.stat().st_size > 0:
                raise FileExistsError(
                    f"{self.path} already holds metrics; pass resume_step=N to continue that run "
                    "from its checkpoint at step N, or choose a new run directory"
                )
        else:
            self._time_offset = _truncate_metrics(self.path, resume_step)
            _drop_rollouts_after(self.run_dir, resume_step)
        self._start = time.monotonic()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._writer: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._writer = SummaryWriter(str(self.run_dir / TENSORBOARD_DIR), purge_step=purge)
        if console is True:
            from looprl.console import console as shared_console

            self._console: Console | None = shared_console
        else:
            self._console = console or None

    @property
    def wall_time(self) -> float:
        """Seconds of logged run time so far (continues across resumes)."""
        return self._time_offset + time.monotonic() - self._start

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Record the metrics of `step` everywhere; return the JSON row that was written.

        Values must be numbers (python, numpy or 0-d torch); NaN and inf are written as null
        to the JSON line and skipped in TensorBoard.
        """
        clash = [k for k in RESERVED if k in metrics]
        if clash:
            raise ValueError(f"metric names {clash} are reserved; rename them")
        values = {k: _to_float(k, v) for k, v in metrics.items()}
        row: dict[str, Any] = {"step": int(step), "wall_time": round(self.wall_time, 3)}
        row.update({k: (v if math.isfinite(v) else None) for k, v in values.items()})
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()
        if self._writer is not None:
            for k, v in values.items():
                if math.isfinite(v):
                    self._writer.add_scalar(k, v, int(step))
            self._writer.flush()
        if self._console is not None:
            self._console.print(format_line(int(step), row), highlight=False, soft_wrap=True)
        return row

    def close(self) -> None:
        """Flush and close the metrics file and the TensorBoard writer."""
        if not self._file.closed:
            self._file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def format_line(step: int, row: Mapping[str, Any]) -> str:
    """The compact console line (Rich markup) for one metrics row; absent metrics are left out."""
    parts = [f"[bold]step {step:>5}[/bold]"]
    mean, std = row.get("reward/mean"), row.get("reward/std")
    if mean is not None:
        reward = f"reward [bold green]{mean:.3f}[/bold green]"
        parts.append(reward + (f" ± {std:.3f}" if std is not None else ""))
    fns = {
        k[7:]: v for k, v in row.items() if k.startswith("reward/") and k[7:] not in ("mean", "std")
    }
    if fns:
        parts.append("[dim]" + " ".join(f"{k}={_num(v)}" for k, v in fns.items()) + "[/dim]")
    for key, label, fmt in _CONSOLE_METRICS:
        value = row.get(key)
        if value is not None:
            parts.append(f"{label} {fmt.format(value)}")
    times = [(label, row.get(f"time/{name}")) for name, label in _TIMES]
    if any(v is not None for _, v in times):
        parts.append(" ".join(f"{n} {v:.1f}s" for n, v in times if v is not None))
    evals = {k[5:]: v for k, v in row.items() if k.startswith("eval/")}
    if evals:
        parts.append(
            "[cyan]eval " + " ".join(f"{k}={_num(v)}" for k, v in evals.items()) + "[/cyan]"
        )
    return " │ ".join(parts)


def save_rollouts(
    run_dir: str | Path, step: int, episodes: Sequence[EpisodeResult], limit: int | None = None
) -> Path:
    """Write `run_dir/rollouts/step_{step:06d}.jsonl`, one `EpisodeResult.to_json()` per line.

    With `limit`, only the first `limit` episodes are kept. The file is written to a temporary
    name and renamed, so readers (the viewer) never see half a file.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0 or None, got {limit}")
    out = Path(run_dir) / ROLLOUTS_DIR / f"step_{step:06d}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    chosen = episodes if limit is None else episodes[:limit]
    text = "".join(ep.to_json() + "\n" for ep in chosen)
    write_text_atomically(out, text)
    return out


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a `metrics.jsonl` file; lines that are not complete JSON objects are skipped."""
    rows = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    for line in text.splitlines(keepends=True):
        row = _parse_row(line)
        if row is not None:
            rows.append(row)
    return rows


def _parse_row(line: str) -> dict[str, Any] | None:
    if not line.endswith("\n"):
        return None  # a line cut short by a kill
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict) or not isinstance(row.get("step"), int):
        return None
    return row


def _truncate_metrics(path: Path, resume_step: int) -> float:
    """Keep only rows with step <= resume_step (rewritten atomically); return the last wall_time."""
    if not path.is_file():
        return 0.0
    kept = [
        line
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True)
        if (row := _parse_row(line)) is not None and row["step"] <= resume_step
    ]
    write_text_atomically(path, "".join(kept))
    last = _parse_row(kept[-1]) if kept else None
    wall = last.get("wall_time") if last else None
    return float(wall) if isinstance(wall, int | float) else 0.0


def _drop_rollouts_after(run_dir: Path, resume_step: int) -> None:
    roll = run_dir / ROLLOUTS_DIR
    for p in roll.iterdir() if roll.is_dir() else []:
        m = _ROLLOUT_FILE.match(p.name)
        if m and int(m.group(1)) > resume_step:
            p.unlink()


def _to_float(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(
            f"metric {key!r} must be a number, got {type(value).__name__}: {value!r}"
        ) from e


def _num(value: Any) -> str:
    if value is None:
        return "n/a"
    v = float(value)
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"
