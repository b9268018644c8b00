"""What the viewer works out from a run's files: group advantages, monitor trips, eval grids.

Nothing here is stored by the trainer, so each is recomputed the way the trainer computes it:

- `group_advantage`: a training episode's group (the consecutive episodes of one task in a
  `rollouts/step_N.jsonl` file) and the advantage `looprl.algorithms.group_advantages` gives
  it, from the group's rewards and the run's saved `algorithm` config, leaving out episodes
  with errors as `looprl.trainer.batch.samples_from_groups` does.
- `monitor_trips`: `monitor/<name>` metrics (1.0 at a step where that monitor tripped).
- `eval_grid`: held-out tasks x eval steps (`eval/step_N/results.jsonl`), mean reward per cell.
- `run_status`: whether a training run is still being written (`live`) or how it ended.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from looprl.trainer.run_summary import SUMMARY_FILE
from looprl.viewer.jsonl import FLAG_ERROR, FLAG_MALFORMED, FLAG_TRUNCATED, EpisodeFile
from looprl.viewer.schema import read_json
from looprl.viewer.tokens import local_dir

MONITOR_PREFIX = "monitor/"
FINAL_QUIET_S = 30.0  # final/ exported and metrics.jsonl unchanged this long: the run finished
IDLE_S = 900.0  # metrics.jsonl unchanged this long and no summary.json: no longer being written


def _table(doc: Any, key: str) -> dict[str, Any]:
    """`doc[key]` when `doc` is an object and that value is one too, else {} (files may be odd)."""
    v = doc.get(key) if isinstance(doc, dict) else None
    return v if isinstance(v, dict) else {}


def _group_bounds(tasks: np.ndarray, i: int, size: int) -> tuple[int, int]:
    """[start, end) of episode `i`'s group: the run of equal task codes around `i`, cut in
    chunks of `size` from the run's start (a task sampled twice in a step gives two groups)."""
    lo = i
    while lo > 0 and tasks[lo - 1] == tasks[i]:
        lo -= 1
    hi = i + 1
    while hi < len(tasks) and tasks[hi] == tasks[i]:
        hi += 1
    if size > 0:
        start = lo + ((i - lo) // size) * size
        return start, min(hi, start + size)
    return lo, hi


def _algorithm(config: Any) -> tuple[dict[str, Any], int | None]:
    """(the saved resolved `algorithm` table, G = rollouts_per_task) of a run's config.json."""
    doc = config if isinstance(config, dict) else {}
    algo = _table(doc, "algorithm")
    inner = _table(doc, "config")
    rollout = _table(inner, "rollout")
    g = rollout.get("rollouts_per_task")
    return algo, g if isinstance(g, int) and not isinstance(g, bool) and g > 0 else None


def group_advantage(f: EpisodeFile, i: int, config: Any) -> dict[str, Any]:
    """Episode `i`'s group in file `f` and its recomputed advantage, with a note saying how.

    Returns `rewards` (the group's rewards in file order, None for an unscored one), `index`
    (this episode's place in it), `size` / `expected` (saved vs G), `advantage` (None with a
    `note` saying why when it cannot be recomputed from the saved file), `advantages`,
    `estimator` and `kept` (False when dynamic sampling or overlong masking drops the episode).
    """
    cols = f.columns()
    algo, size = _algorithm(config)
    lo, hi = _group_bounds(cols["task"], i, size or 0)
    rewards = [None if math.isnan(r) else float(r) for r in cols["reward"][lo:hi]]
    flags = cols["flags"][lo:hi]
    out: dict[str, Any] = {
        "rewards": rewards,
        "index": i - lo,
        "first": lo,
        "size": hi - lo,
        "expected": size,
        "advantage": None,
        "advantages": None,
        "estimator": algo.get("advantage"),
        "preset": algo.get("name"),
        "kept": True,
        "note": "",
    }
    why = _cannot_recompute(algo, size, hi - lo, flags[i - lo])
    if why:
        out["note"] = why
        return out
    usable = [k for k in range(hi - lo) if not flags[k] & (FLAG_ERROR | FLAG_MALFORMED)]
    if len(usable) < 2:
        out["note"] = "fewer than 2 episodes of this group have no errors: the group trains nothing"
        return out
    out.update(_advantages(algo, [rewards[k] or 0.0 for k in usable], flags[usable]))
    advs = [None] * (hi - lo)
    for n, k in enumerate(usable):
        advs[k] = out["advantages"][n]
    out["kept"] = out["keep"][usable.index(i - lo)]
    out["advantages"], out["advantage"] = advs, advs[i - lo]
    del out["keep"]
    return out


def _cannot_recompute(algo: dict[str, Any], size: int | None, saved: int, flag: int) -> str:
    """Why the saved file cannot give this episode's advantage, or '' when it can."""
    name = algo.get("advantage")
    if not name:
        return "config.json has no `algorithm` table: advantage not recomputed"
    if name == "gae":
        return "PPO's GAE advantage is per token, from the value head: not stored, not recomputed"
    if name == "batch_whitened":
        return "batch-whitened advantages need the whole batch, which the rollout file may not hold"
    if algo.get("overlong_buffer_frac"):
        return "overlong shaping needs each episode's length budget: advantage not recomputed"
    if size is not None and saved < size:
        return f"only {saved} of this group's {size} episodes were saved (trainer.save_rollouts)"
    if flag & FLAG_ERROR:
        return "this episode has errors: it was left out of training and of its group's baseline"
    return ""


def _advantages(algo: dict[str, Any], rewards: list[float], flags: np.ndarray) -> dict[str, Any]:
    """`group_advantages` of one group (the trainer's math, imported lazily: it needs torch)."""
    import torch

    from looprl.algorithms.objective import group_advantages
    from looprl.algorithms.presets import AlgorithmConfig

    known = AlgorithmConfig.__dataclass_fields__
    cfg = AlgorithmConfig(**{k: v for k, v in algo.items() if k in known})
    r = torch.tensor([rewards], dtype=torch.float32)  # (1, G)
    truncated = torch.tensor([[bool(x & FLAG_TRUNCATED) for x in flags]])  # (1, G)
    res = group_advantages(cfg, r, truncated=truncated)
    adv = res.advantages if res.advantages is not None else torch.zeros_like(r)
    return {"advantages": [float(a) for a in adv[0]], "keep": [bool(k) for k in res.keep[0]]}


def monitor_trips(rows: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Each `monitor/<name>` metric that tripped: name, first step, and every step it was on."""
    trips: dict[str, list[float]] = {}
    for row in rows:
        for k, v in row.items():
            if k.startswith(MONITOR_PREFIX) and v >= 0.5:
                trips.setdefault(k[len(MONITOR_PREFIX) :], []).append(row.get("step", 0.0))
    return [
        {"name": name, "first_step": steps[0], "steps": steps}
        for name, steps in sorted(trips.items(), key=lambda kv: (kv[1][0], kv[0]))
    ]


def eval_grid(files: list[tuple[str, int | None, EpisodeFile]], names: list[str]) -> dict[str, Any]:
    """Held-out tasks x eval files: per cell the mean reward, the count and the episode indexes.

    `files` are (key, step, file) in step order; `names` maps task codes to task ids. Tasks are
    listed in the order the first eval file holds them.
    """
    columns = [{"file": key, "step": step} for key, step, _ in files]
    cells: dict[int, list[dict[str, Any] | None]] = {}
    for c, (_, _, f) in enumerate(files):
        cols = f.columns()
        ok = (cols["flags"] & FLAG_MALFORMED) == 0
        for code in dict.fromkeys(int(t) for t in cols["task"][ok]):
            idx = np.nonzero(ok & (cols["task"] == code))[0]
            rs = cols["reward"][idx]
            rs = rs[~np.isnan(rs)]
            row = cells.setdefault(code, [None] * len(files))
            row[c] = {
                "mean": float(rs.mean()) if len(rs) else None,
                "n": len(idx),
                "i": [int(x) for x in idx],
            }
    tasks = [{"task_id": names[code], "cells": row} for code, row in cells.items()]
    return {"columns": columns, "tasks": tasks}


def _start(config: Any) -> tuple[str | None, str | None]:
    """(the model a training run started from, its environment's name) from its config.json."""
    doc = config if isinstance(config, dict) else {}
    inner = _table(doc, "config")
    model = _table(inner, "model")
    env = _table(inner, "env")
    name = model.get("name", doc.get("model"))
    return (name if isinstance(name, str) else None), env.get("name")


def eval_anchor(train_path: Path, config: Any, eval_path: Path, meta: Any) -> dict[str, Any] | None:
    """Where an eval result directory sits on a training run's curves, or None when it does not.

    An eval of the model the run started from is its "before" (step 0); an eval of the run's
    `final/` or of `checkpoints/step_N` is an "after" at the last step or at N (`step` None:
    the page puts it at the run's last step). Its numbers are named as the trainer names its
    own held-out evals (`looprl.trainer.metrics.eval_metrics`), so they land on the same charts.
    """
    from looprl.trainer.metrics import eval_metrics

    start_model, env = _start(config)
    if not isinstance(meta, dict) or not isinstance(meta.get("model"), str):
        return None
    if env and meta.get("env") not in (None, env):
        return None  # an eval of another environment
    start = local_dir(start_model, train_path) if start_model else None
    where = local_dir(meta["model"], eval_path)
    if where is None and meta["model"] != start_model:
        return None
    where = where.resolve() if where is not None else None
    if meta["model"] == start_model or (start is not None and where == start.resolve()):
        label, step = "before", 0
    elif where is None:
        return None
    elif where == (train_path / "final").resolve():
        label, step = "after", None
    elif where.parent == (train_path / "checkpoints").resolve() and where.name[5:].isdigit():
        label, step = "after", int(where.name[5:])
    else:
        return None
    try:
        metrics = eval_metrics(meta.get("summary"))  # type: ignore[arg-type]  # checked below
    except (KeyError, TypeError, AttributeError):
        return None
    clean = {
        k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)
    }
    return {"label": label, "step": step, "metrics": clean}


def run_status(path: Path, now: float | None = None) -> dict[str, str]:
    """{"status", "why"} of the training run in `path`.

    `status` is the one `RUN/summary.json` names (`finished`, `stopped early`, `interrupted`,
    `failed`) once the trainer wrote it; `finished` when the model was exported (`final/`) and
    `metrics.jsonl` stopped growing (runs from before summary.json); `idle` when `metrics.jsonl`
    has not changed for `IDLE_S` seconds; otherwise `live` (still being written).
    """
    now = time.time() if now is None else now
    summary = read_json(path / SUMMARY_FILE)
    if isinstance(summary, dict) and isinstance(summary.get("status"), str):
        error = summary.get("error")
        return {
            "status": summary["status"],
            "why": f"{SUMMARY_FILE}" + (f": {error}" if error else ""),
        }
    metrics = path / "metrics.jsonl"
    quiet = now - metrics.stat().st_mtime if metrics.exists() else math.inf
    if (path / "final").is_dir() and quiet >= FINAL_QUIET_S:
        return {"status": "finished", "why": "final/ exported and metrics.jsonl no longer grows"}
    if quiet >= IDLE_S:
        return {
            "status": "idle",
            "why": f"no summary.json; metrics.jsonl unchanged for {quiet / 60:.0f} min",
        }
    return {"status": "live", "why": "metrics.jsonl is being written"}
