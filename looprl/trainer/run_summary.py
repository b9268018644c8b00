"""`RUN/summary.json`: what a training run ended with, for scripts and for a stranger's first look.

Written (atomically, strict JSON) when `looprl train` ends, however it ends:

- `status`: `finished` (all `trainer.steps` ran), `stopped early` (`trainer.early_stop_metric`
  reached its value), `interrupted` (Ctrl-C: continue with `--resume`) or `failed` (`error` says why);
- `step` (the last logged step) of `steps`, and `seconds` this process ran;
- `last_metrics`: the last `metrics.jsonl` row;
- `eval`: the last and the best held-out `eval/reward` with their steps (null when none ran);
- `paths`: the run directory, `metrics.jsonl`, `config.json` and the exported model `final/`
  (null while it does not exist).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from looprl import safe_json
from looprl.files import write_text_atomically
from looprl.trainer.logger import METRICS_FILE, read_metrics

RunStatus = Literal["finished", "stopped early", "interrupted", "failed"]

SUMMARY_FILE = "summary.json"
EVAL_KEY = "eval/reward"


def run_summary(
    run_dir: Path, *, status: RunStatus, steps: int, seconds: float, error: str | None = None
) -> dict[str, Any]:
    """The summary of the run in `run_dir` (see the module doc), read from its files."""
    rows = read_metrics(run_dir / METRICS_FILE)
    last = rows[-1] if rows else {}
    evals = [(r["step"], r[EVAL_KEY]) for r in rows if isinstance(r.get(EVAL_KEY), int | float)]
    final = run_dir / "final"
    return {
        "status": status,
        "error": error,
        "step": last.get("step", 0),
        "steps": steps,
        "seconds": round(seconds, 3),
        "last_metrics": last,
        "eval": _evals(evals),
        "paths": {
            "run": str(run_dir),
            "metrics": str(run_dir / METRICS_FILE),
            "config": str(run_dir / "config.json"),
            "final": str(final) if final.is_dir() else None,
        },
    }


def _evals(evals: list[tuple[int, float]]) -> dict[str, Any] | None:
    """The last and the best held-out reward with their steps; None when no evaluation ran."""
    if not evals:
        return None
    best = max(evals, key=lambda se: se[1])
    return {
        "last": {"step": evals[-1][0], "reward": evals[-1][1]},
        "best": {"step": best[0], "reward": best[1]},
    }


def write_run_summary(
    run_dir: Path, *, status: RunStatus, steps: int, seconds: float, error: str | None = None
) -> Path:
    """Write `run_dir/summary.json` atomically; its path."""
    summary = run_summary(run_dir, status=status, steps=steps, seconds=seconds, error=error)
    path = run_dir / SUMMARY_FILE
    write_text_atomically(path, safe_json.dumps(summary, indent=2))
    return path
