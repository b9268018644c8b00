"""Replay a finished run through the monitors: what would have tripped, and how noisy each series is.

    python -m looprl.trainer.monitors.replay RUN_DIR [--monitors.FIELD VALUE ...]

Reads `RUN_DIR/metrics.jsonl` (a run written before the metric namespaces too: `read_metrics`
renames its keys) and the episodes the run saved (`rollouts/step_*.jsonl`, at most
`trainer.save_rollouts` per step, so the episode-based monitors see a sample), rebuilds the
rubric from `RUN_DIR/config.json`, and prints each step's monitor readings, then each series'
natural noise: its largest and smallest ratio to the rolling baseline the spike monitors use,
entropy against its starting level, and the held-out metric's moves between evaluations. The
defaults of `[monitors]` were set from this output (docs/reward_hacking.md).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from looprl.trainer.config import load_config, parse_cli_overrides
from looprl.trainer.logger import METRICS_FILE, ROLLOUTS_DIR, read_metrics
from looprl.trainer.monitors.config import MonitorsSection
from looprl.trainer.monitors.core import MONITORS, Monitors
from looprl.types import EpisodeResult

SPIKE_SERIES = (
    "rollout/reply_tokens",
    "rollout/turns",
    "rollout/tool_calls",
    "policy/kl",
    "policy/mismatch_kl",
    "policy/logprob_gap",
)
EPISODE_SERIES = (
    "rollout/format_only_frac",
    "rollout/repeat_ngram_frac",
    "rollout/reward_agreement",
)


def replay(run_dir: Path, cfg: MonitorsSection, rubric: Any) -> list[dict[str, float]]:
    """Each logged step's row joined with what the monitors return for it now."""
    warnings: list[str] = []
    monitors = Monitors(cfg, rubric, warn=warnings.append)
    rows = []
    for row in read_metrics(run_dir / METRICS_FILE):
        step = row["step"]
        path = run_dir / ROLLOUTS_DIR / f"step_{step:06d}.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() and step else []
        episodes = [EpisodeResult.from_json(line) for line in lines]
        numbers = {k: float(v) for k, v in row.items() if isinstance(v, int | float)}
        rows.append({**numbers, **monitors.observe(step, numbers, [episodes])})
    for line in warnings:
        print(f"would warn: {line}")
    return rows


def noise(rows: list[dict[str, float]], cfg: MonitorsSection) -> dict[str, str]:
    """Each series' spread against the baselines the monitors compare it with."""
    out = {}
    for key in SPIKE_SERIES:
        values = [r[key] for r in rows if key in r]
        ratios = [
            v / base
            for i, v in enumerate(values)
            if i >= cfg.min_history
            and (base := statistics.median(values[max(0, i - cfg.window) : i])) > 0
        ]
        if ratios:
            out[key] = f"value / rolling median: {min(ratios):.2f} .. {max(ratios):.2f}"
    entropy = [r["policy/entropy"] for r in rows if "policy/entropy" in r]
    if len(entropy) > cfg.window:
        start = statistics.median(entropy[: cfg.window])
        low = min(entropy[cfg.window :])
        out["policy/entropy"] = f"start {start:.3g}, lowest after {low:.3g} (x{low / start:.2f})"
    held = [(int(r["step"]), r[cfg.heldout_metric]) for r in rows if cfg.heldout_metric in r]
    if held:
        out[cfg.heldout_metric] = " ".join(f"{s}:{v:.3f}" for s, v in held)
    for key in EPISODE_SERIES:
        values = [r[key] for r in rows if key in r]
        if values:
            out[key] = f"{min(values):.3f} .. {max(values):.3f}"
    return out


def main(argv: list[str]) -> int:
    """`RUN_DIR [--monitors.FIELD VALUE ...]`: print readings, trips and noise; 0 on success."""
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    run_dir = Path(argv[0])
    record = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    env = record["config"]["env"]  # the rest may hold fields since renamed: only env matters
    overrides = {"env.name": env["name"], "env.kwargs": env.get("kwargs", {})}
    cfg = load_config(None, {**overrides, **parse_cli_overrides(argv[1:])})
    from looprl.trainer.setup import load_env

    rows = replay(run_dir, cfg.monitors, load_env(cfg).rubric)
    for row in rows:
        tripped = [name for name in MONITORS if row.get(f"monitor/{name}") == 1.0]
        shown = " ".join(f"{k}={row[k]:.3g}" for k in EPISODE_SERIES if k in row)
        print(f"step {int(row['step']):>4} {shown} {' '.join(tripped) or '-'}")
    for key, text in noise(rows, cfg.monitors).items():
        print(f"{key}: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
