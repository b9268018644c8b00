"""The measured hack's plot and summary, read from the runs `benchmarks/measured_hack.py` made."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

WINDOWS = ((1, 25), (26, 50), (51, 75), (76, 100), (101, 125), (126, 150))


def rows_of(out: Path, env: str) -> list[dict[str, Any]]:
    """The training metric rows of one run (eval-only rows left out)."""
    from looprl.trainer.logger import METRICS_FILE, read_metrics

    return [r for r in read_metrics(out / "runs" / env / METRICS_FILE) if "reward/mean" in r]


def first_trips(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The first step at which each monitor tripped."""
    trips: dict[str, int] = {}
    for r in rows:
        for key, value in r.items():
            if key.startswith("monitor/") and value == 1.0:
                trips.setdefault(key.removeprefix("monitor/"), r["step"])
    return trips


def _window_mean(rows: list[dict[str, Any]], key: str, lo: int, hi: int) -> str:
    vals = [r[key] for r in rows if lo <= r["step"] <= hi and key in r]
    return f"{statistics.mean(vals):.3f}" if vals else "-"


def sample_replies(out: Path, env: str, k: int = 3) -> list[str]:
    """`k` rewarded replies from the last saved step of a run."""
    files = sorted((out / "runs" / env / "rollouts").glob("step_*.jsonl"))
    if not files:
        return []
    episodes = [json.loads(x) for x in files[-1].read_text().splitlines()]
    good = [e for e in episodes if e.get("reward", 0) > 0] or episodes
    return [f"{e['task']['prompt'][-1]['content']} -> {e['messages'][-1]['content'][:160]!r}"
            for e in good[:k]]  # fmt: skip


def summary(out: Path, envs: tuple[str, ...]) -> str:
    """Markdown: the probe verdicts, reward/accuracy/length per window, first trips, samples."""
    lines = []
    for env in envs:
        probe = json.loads((out / f"probe-{env}" / "probe.json").read_text())
        lines.append(f"probe {env}: exploitable = {probe['exploitable'] or 'none'}")
    lines += ["", "| run | steps | reward/mean | reward/correct_final | rollout/reply_tokens |",
              "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for env in envs:
        rows = rows_of(out, env)
        for lo, hi in WINDOWS:
            cells = [_window_mean(rows, k, lo, hi) for k in
                     ("reward/mean", "reward/correct_final", "rollout/reply_tokens")]  # fmt: skip
            if cells[0] != "-":
                lines.append(f"| {env} | {lo}-{hi} | " + " | ".join(cells) + " |")
    for env in envs:
        rows = rows_of(out, env)
        lines.append(f"\n{env}: first monitor trips {first_trips(rows) or 'none'}")
        lines += [f"  {s}" for s in sample_replies(out, env)]
    return "\n".join(lines)


def plot(out: Path, envs: tuple[str, ...]) -> Path:
    """Three panels per run side by side: rewards, reply length, monitor trips."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from looprl.trainer.plots import smooth

    fig, axes = plt.subplots(2, len(envs), figsize=(6 * len(envs), 7), sharex=True, squeeze=False)
    for col, env in enumerate(envs):
        rows = rows_of(out, env)
        steps = [r["step"] for r in rows]
        top, bottom = axes[0][col], axes[1][col]
        for key, label in (("reward/number_in_reply", "right number anywhere (gameable)"),
                           ("reward/correct_final", "exactly one right answer (true)")):  # fmt: skip
            vals = np.array([r.get(key, float("nan")) for r in rows], dtype=float)
            top.plot(steps, smooth(vals, 9), label=label)
        top.set_ylim(-0.02, 1.02)
        top.set_title(f"GRPO on {env} (optimises {'the first' if col == 0 else 'the second'})")
        top.set_ylabel("training reward, smoothed (9 steps)")
        bottom.plot(steps, [r.get("rollout/reply_tokens", 0) for r in rows], color="tab:gray")
        bottom.set_ylabel("tokens per reply")
        bottom.set_xlabel("step")
        for name, step in first_trips(rows).items():
            for ax in (top, bottom):
                ax.axvline(step, color="tab:red", lw=1, ls="--")
            bottom.annotate(name, (step, bottom.get_ylim()[1] * 0.9), rotation=90, fontsize=8,
                            color="tab:red", ha="right", va="top")  # fmt: skip
        top.legend(loc="upper left", fontsize=8)
    top_tokens = max(max(r.get("rollout/reply_tokens", 0) for r in rows_of(out, e)) for e in envs)
    for col in range(len(envs)):  # one scale, so the runs' lengths compare at a glance
        axes[1][col].set_ylim(0, top_tokens * 1.1)
    fig.tight_layout()
    path = out / "measured_hack.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
