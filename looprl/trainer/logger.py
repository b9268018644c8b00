"""Training metrics to `metrics.jsonl`, TensorBoard and one Rich console line per step; rollout dumps.

Metric keys are declared once, in `looprl.trainer.metrics.METRICS` (listed in docs/metrics.md);
the logger writes whatever it is given, and a test holds the trainer to that vocabulary. Rows read
back (`read_metrics`, a resume) have the bare names of runs written before the namespaces
renamed (`looprl.trainer.metrics.upgrade_row`).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rich.console import Console
from rich.markup import escape

from looprl.console import LINE_WIDTH  # step lines fit in it; parts that would not are left out
from looprl.files import write_text_atomically, writing
from looprl.trainer.metrics import upgrade_row
from looprl.trainer.progress import no_gradient
from looprl.trainer.wandb_logger import resolve_mode
from looprl.types import EpisodeResult

if TYPE_CHECKING:
    from looprl.trainer.config import TrainConfig
    from looprl.trainer.wandb_logger import WandbLogger

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
ROLLOUTS_DIR = "rollouts"
RESERVED = ("step", "wall_time")
_ROLLOUT_FILE = re.compile(r"^step_(\d+)\.jsonl$")

SEP = " │ "

# (key, console label, format) of the optional metrics on the step line, most wanted first;
# the line keeps as many as fit in LINE_WIDTH, after the reward functions.
_CONSOLE_METRICS: tuple[tuple[str, str, str], ...] = (
    ("loss/total", "loss", "{:+.4f}"),
    ("policy/entropy", "ent", "{:.3f}"),
    ("policy/kl", "kl", "{:.2e}"),
    ("train/grad_norm", "gnorm", "{:.3f}"),
    ("policy/clip_frac", "clip", "{:.3f}"),
    ("train/zero_var_frac", "0var", "{:.2f}"),
    ("policy/mismatch_kl", "mkl", "{:.1e}"),
    ("rollout/tokens_per_s", "tok/s", "{:.0f}"),
    ("train/lr", "lr", "{:.1e}"),
)
_TIMES = (("generate", "gen"), ("score", "score"), ("train", "train"), ("sync", "sync"))


class MetricsLogger:
    """Appends one JSON line per step to `run_dir/metrics.jsonl`, mirrors to TensorBoard and console.

    A new run (`resume_step=None`) refuses to append to an existing non-empty `metrics.jsonl`
    (two runs mixed in one file would be unreadable). `resume_step=N` continues a run from its
    checkpoint at step N: lines with step > N (logged after the checkpoint by a run that was
    then killed) are removed, as are their rollout files and TensorBoard events, and
    `wall_time` continues from the last kept line. `console` may be a Rich `Console` to print to.
    With `total_steps`, each console line shows `step k/N` and an ETA: the mean time of the steps
    logged by this process so far, times the steps left. A `tracker` (`WandbLogger`) gets each
    row too and is closed with the logger.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        console: bool | Console = True,
        resume_step: int | None = None,
        total_steps: int | None = None,
        tracker: WandbLogger | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.tracker = tracker
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
        self.total_steps = total_steps
        self._base_step = resume_step or 0  # the ETA averages the steps after this one
        self._base_time = self._start
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 (closed in close())
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
        line = memoryview((json.dumps(row, allow_nan=False) + "\n").encode("utf-8"))
        with writing(self.path):  # a full disk names metrics.jsonl; the rows before stay whole
            while line:  # unbuffered: nothing a full disk refused is left to fail again at close
                line = line[self._file.write(line) :]
        if self._writer is not None:
            for k, v in values.items():
                if math.isfinite(v):
                    self._writer.add_scalar(k, v, int(step))
            self._writer.flush()
        if self._console is not None:
            self._print(int(step), row)
        if self.tracker is not None:
            self.tracker.log(int(step), row)
        return row

    def _print(self, step: int, row: Mapping[str, Any]) -> None:
        """The step line, and the held-out evaluation line when the row has one.

        A row of an evaluation alone (the one before training: eval/ and time/ keys) prints only
        the latter.
        """
        assert self._console is not None
        eta = self._eta(step)
        width = min(LINE_WIDTH, self._console.width)  # a narrower terminal gets shorter lines
        if any(k not in RESERVED and not k.startswith(("eval/", "time/")) for k in row):
            line = format_line(step, row, total=self.total_steps, eta_s=eta, width=width)
            self._console.print(line, highlight=False, soft_wrap=True)
        evals = format_eval_line(step, row, width=width)
        if evals is not None:
            self._console.print(evals, highlight=False, soft_wrap=True)

    def _eta(self, step: int) -> float | None:
        """Seconds left at the mean pace of this process's steps; None before the first."""
        now = time.monotonic()
        if step <= self._base_step:  # e.g. the evaluation before training, logged as step 0
            self._base_time = now
            return None
        if self.total_steps is None:
            return None
        per_step = (now - self._base_time) / (step - self._base_step)
        return per_step * max(self.total_steps - step, 0)

    def close(self) -> None:
        """Flush and close the metrics file and the TensorBoard writer."""
        if not self._file.closed:
            self._file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def config_summary(
    cfg: TrainConfig, *, algorithm: str, env: str, run_dir: Path, device: str
) -> str:
    """The few lines (Rich markup) the trainer prints at start; the full config is `config.json`."""
    m, r, o, t, e = cfg.model, cfg.rollout, cfg.optim, cfg.trainer, cfg.engine
    overrides = ", ".join(f"{k}={v}" for k, v in cfg.algorithm.overrides.items())
    env_args = ", ".join(f"{k}={v}" for k, v in cfg.env.kwargs.items())
    weights = f"LoRA r{m.lora_r}" if m.lora else "full weights"
    servers = f" ({len(e.base_urls) or e.num_servers} server(s))" if e.kind != "torch" else ""
    evals = (
        f"eval every {t.eval_every} steps on {t.eval_tasks} tasks" if t.eval_every else "no eval"
    )
    lines = [
        f"[bold]looprl train[/bold] {escape(env)}{f' ({escape(env_args)})' if env_args else ''}"
        f" · {escape(m.name)} · {algorithm}{f' ({escape(overrides)})' if overrides else ''}"
        f" → {escape(str(run_dir))} [dim](full config: config.json there)[/dim]",
        f"  {t.steps} steps × {r.tasks_per_step} tasks × {r.rollouts_per_task} rollouts"
        f" · lr {o.lr:.1e} ({o.schedule}, warm-up {o.warmup_steps}) · temperature"
        f" {r.temperature:g} · seed {t.seed}",
        f"  engine {e.kind}{servers} on {device} · {weights} · {evals}"
        f" · checkpoint every {t.save_every} steps"
        + (f" · W&B {resolve_mode(cfg.run.wandb_mode)}" if cfg.run.wandb else ""),
    ]
    return "\n".join(lines)


def format_line(
    step: int,
    row: Mapping[str, Any],
    *,
    total: int | None = None,
    eta_s: float | None = None,
    width: int = LINE_WIDTH,
) -> str:
    """The console line (Rich markup) of one metrics row; its text fits in `width` columns.

    `step k/N`, the reward and the elapsed time (with the ETA when `eta_s` is given) are always
    there; the reward functions (the signal a run is watched for), then the metrics of
    `_CONSOLE_METRICS` in their order, are added while they fit. Absent metrics are left out,
    never shown as zeros. A step with no gradient (every group uniform) always says so.
    """
    counter = f"step {step:>{len(str(total))}}/{total}" if total else f"step {step}"
    parts = [_Part(counter, "bold", -1, "")]
    mean, std = row.get("reward/mean"), row.get("reward/std")
    if mean is not None:
        text = f"reward {mean:.3f}" + (f" ± {std:.3f}" if std is not None else "")
        parts.append(_Part(text, "bold green", -1))
    parts += _step_parts(row)
    if no_gradient(row):  # always shown: the step taught nothing (see NoGradientWarning)
        parts.append(_Part("no gradient", "bold yellow", -1))
    clock = format_duration(row["wall_time"]) if row.get("wall_time") is not None else ""
    if eta_s is not None:
        clock += f"{', ' if clock else ''}ETA {format_duration(eta_s)}"
    if clock:
        parts.append(_Part(clock, "dim", -1))
    return _fit(parts, width)


def format_eval_line(step: int, row: Mapping[str, Any], *, width: int = LINE_WIDTH) -> str | None:
    """The held-out evaluation line (Rich markup) of a metrics row, or None when it has none.

    Its values (`eval/reward` first, as the trainer logs it) are kept in order while they fit.
    """
    evals = [(k[5:], v) for k, v in row.items() if k.startswith("eval/") and v is not None]
    if not evals:
        return None
    head = _Part(f"  eval at step {step}:", "bold cyan", -1, "")
    parts = [_Part(f"{k}={_num(v)}", "cyan", i, " ") for i, (k, v) in enumerate(evals)]
    return _fit([head, *parts], width)


class _Part(NamedTuple):
    """A piece of a console line: its text, Rich style, preference (-1: always kept, then 0
    first) and the separator written before it."""

    text: str
    style: str
    rank: int
    sep: str = SEP


def _step_parts(row: Mapping[str, Any]) -> list[_Part]:
    """The optional parts of a step line in display order: reward functions, then metrics."""
    fns = [
        (k[7:], v)
        for k, v in row.items()
        if k.startswith("reward/") and k[7:] not in ("mean", "std") and v is not None
    ]
    parts = [_Part(f"{k}={_num(v)}", "green", i, " ") for i, (k, v) in enumerate(fns)]
    rank = len(parts)
    for key, label, fmt in _CONSOLE_METRICS:
        value = row.get(key)
        if value is not None:
            parts.append(_Part(f"{label} {fmt.format(value)}", "", rank))
            rank += 1
    times = [(label, row.get(f"time/{name}")) for name, label in _TIMES]
    if any(v is not None for _, v in times):
        text = " ".join(f"{n} {v:.1f}s" for n, v in times if v is not None)
        parts.append(_Part(text, "dim", rank))
    return parts


def _fit(parts: list[_Part], width: int) -> str:
    """Rich markup of the parts that fit in `width` columns, chosen by rank, shown in order."""
    used = sum(len(p.sep) + len(p.text) for p in parts if p.rank < 0)
    kept = {i for i, p in enumerate(parts) if p.rank < 0}
    for i, p in sorted(enumerate(parts), key=lambda ip: ip[1].rank):
        if p.rank >= 0 and used + len(p.sep) + len(p.text) <= width:
            kept.add(i)
            used += len(p.sep) + len(p.text)
    return "".join(
        p.sep + (f"[{p.style}]{escape(p.text)}[/{p.style}]" if p.style else escape(p.text))
        for i, p in enumerate(parts)
        if i in kept
    )


def format_duration(seconds: float) -> str:
    """A number of seconds as `42s`, `12m05s` or `3h07m`."""
    s = max(0, round(float(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


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
    """The rows of a `metrics.jsonl` file, old metric names renamed (`upgrade_row`); lines that
    are not complete JSON objects are skipped.

    It skips where `looprl.files.iter_jsonl` raises: the trainer appends to this file while the
    viewer and the monitors read it, and a kill can leave its last line cut short.
    """
    rows = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    for line in text.splitlines(keepends=True):
        row = _parse_row(line)
        if row is not None:
            rows.append(upgrade_row(row))
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
    """Keep only rows with step <= resume_step; return the last wall_time.

    The file is rewritten atomically with old metric names renamed, so a run started before the
    namespaces continues with one set of names.
    """
    kept = [row for row in read_metrics(path) if row["step"] <= resume_step]
    write_text_atomically(path, "".join(json.dumps(row) + "\n" for row in kept))
    wall = kept[-1].get("wall_time") if kept else None
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
