"""Resumable training runs for the comparison scripts: a finished run is read back, not rerun.

One run directory per run. `run_resumable` decides what to do with it:

1. `done.json` says it finished with at least the requested steps: read its metrics ("reused").
2. It holds a checkpoint: continue from the newest intact one, exactly as `looprl train --resume`
   does ("resumed"; the step is recorded in `resumes.json`, so the report can say which runs
   were resumed and where). A finished run asked for more steps continues the same way.
3. Otherwise (new, or killed before its first checkpoint): start it from scratch ("ran").

The run's saved `config.json` must match the requested config (steps aside), so a changed
setting never silently reuses an old run. A lock file (`sweep.lock`, holding the pid) keeps two
sweeps sharing an output directory off the same run: start the same command twice to run two at
a time, and each takes the runs the other has not. Finished runs drop their checkpoints unless
asked to keep them (`final/` stays), so a sweep of a hundred runs stays small on disk.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from looprl.trainer.checkpoint.single import list_checkpoints
from looprl.trainer.config import TrainConfig
from looprl.trainer.logger import METRICS_FILE, read_metrics
from looprl.trainer.trainer import Trainer

DONE = "done.json"
RESUMES = "resumes.json"
LOCK = "sweep.lock"
Status = Literal["ran", "resumed", "reused", "busy", "missing"]


@dataclass
class RunResult:
    """What one run gave: its metric rows and how they were obtained."""

    name: str
    status: Status
    """ran (fresh), resumed (from a checkpoint), reused (finished before), busy (another sweep
    holds it), missing (not finished, and only finished runs were asked for)"""
    rows: list[dict[str, Any]] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)
    """checkpoint steps this run was resumed from, over every invocation"""


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run's `metrics.jsonl`, old metric names renamed (empty when it has none)."""
    return read_metrics(run_dir / METRICS_FILE)


def run_resumable(
    cfg: TrainConfig, run_dir: Path, *, keep_checkpoints: bool = False, finished_only: bool = False
) -> RunResult:
    """Reuse, resume or start the run of `cfg` in `run_dir` (see the module docstring);
    `finished_only` reads a finished run back and starts nothing (`missing` otherwise)."""
    steps = cfg.trainer.steps
    done = _read_json(run_dir / DONE)
    if run_dir.is_dir():
        check_same_config(cfg, run_dir)
    if done is not None and done["steps"] >= steps:
        rows = [r for r in read_rows(run_dir) if r["step"] <= steps]
        return RunResult(run_dir.name, "reused", rows, _read_json(run_dir / RESUMES) or [])
    if finished_only:
        return RunResult(run_dir.name, "missing")
    if not _lock(run_dir):
        return RunResult(run_dir.name, "busy")
    try:
        status: Status = "ran"
        resumes: list[int] = _read_json(run_dir / RESUMES) or []
        checkpoints = list_checkpoints(run_dir)
        if checkpoints:
            status = "resumed"
            resumes.append(checkpoints[-1][0])
            (run_dir / RESUMES).write_text(json.dumps(resumes))
            (run_dir / DONE).unlink(missing_ok=True)
            Trainer(cfg, run_dir=run_dir, resume=True).run()
        else:
            if done is not None:
                raise SystemExit(
                    f"{run_dir} finished {done['steps']} steps and its checkpoints were removed, "
                    f"so it cannot continue to {steps}; delete it, or keep checkpoints "
                    "(--keep-checkpoints) in sweeps you mean to extend"
                )
            _clear(run_dir)  # an attempt killed before its first checkpoint leaves nothing to keep
            Trainer(cfg, run_dir=run_dir).run()
        (run_dir / DONE).write_text(json.dumps({"steps": steps, "resumed_from": resumes}))
        if not keep_checkpoints:
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        return RunResult(run_dir.name, status, read_rows(run_dir), resumes)
    finally:
        (run_dir / LOCK).unlink(missing_ok=True)


def check_same_config(cfg: TrainConfig, run_dir: Path) -> None:
    """SystemExit naming the fields where `run_dir`'s saved config differs from `cfg` (steps aside)."""
    saved = _read_json(run_dir / "config.json")
    if saved is None:
        return
    want = _flat(json.loads(json.dumps(cfg.model_dump(), default=str)))
    have = _flat(saved["config"])
    differ = sorted(
        k for k in set(want) | set(have) if k != "trainer.steps" and want.get(k) != have.get(k)
    )
    if differ:
        shown = ", ".join(f"{k}: {have.get(k)!r} there, {want.get(k)!r} now" for k in differ[:5])
        raise SystemExit(
            f"{run_dir} holds a run with other settings ({shown}); pass another --out, "
            "or delete that run directory to redo it"
        )


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key != "kwargs" and key != "overrides":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text("utf-8")) if path.is_file() else None


def _lock(run_dir: Path) -> bool:
    """Take the run's lock; False when a live process holds it (a stale lock is taken over)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _alive(path):
                return False
            path.unlink(missing_ok=True)  # its process is gone: the lock is stale
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _alive(lock: Path) -> bool:
    try:
        pid = int(lock.read_text().strip() or "0")
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError, FileNotFoundError):
        return False
    except PermissionError:  # a live process of another user
        return True
    return pid > 0


def _clear(run_dir: Path) -> None:
    """Remove what a run killed before its first checkpoint wrote (the lock stays)."""
    for child in run_dir.iterdir():
        if child.name == LOCK:
            continue
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()
