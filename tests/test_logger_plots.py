"""Metrics logger (JSONL lines, resume truncation, console line), rollout files and PNG plots."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rich.console import Console

from looprl.trainer.logger import MetricsLogger, format_line, read_metrics, save_rollouts
from looprl.trainer.plots import (
    Panel,
    band_limits,
    plot_comparison,
    plot_panels,
    plot_run,
    series,
    smooth,
)
from looprl.types import EpisodeResult, Message, Task, Trajectory

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def quiet_logger(run_dir: Path, **kw: object) -> MetricsLogger:
    return MetricsLogger(run_dir, tensorboard=False, console=False, **kw)  # type: ignore[arg-type]


def lines(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_metrics_line_format(tmp_path: Path) -> None:
    with quiet_logger(tmp_path) as log:
        log.log(
            1,
            {
                "reward/mean": 0.5,
                "policy/kl": float("nan"),
                "policy/entropy": np.float32(1.25),
                "loss/total": torch.tensor(-0.5),
                "policy/clip_frac": float("inf"),
                "n": 3,
            },
        )
        log.log(2, {"reward/mean": 0.75})
    rows = lines(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    first = rows[0]
    assert list(first)[:2] == ["step", "wall_time"]
    assert first["reward/mean"] == 0.5 and first["policy/entropy"] == 1.25
    assert first["loss/total"] == -0.5 and first["n"] == 3.0
    assert first["policy/kl"] is None and first["policy/clip_frac"] is None
    assert 0.0 <= first["wall_time"] <= rows[1]["wall_time"] < 60
    # Every line is strict JSON (no NaN/Infinity tokens) and ends with a newline.
    text = (tmp_path / "metrics.jsonl").read_text()
    assert text.endswith("\n") and "NaN" not in text and "Infinity" not in text


def test_bad_metrics_fail_clearly(tmp_path: Path) -> None:
    with quiet_logger(tmp_path) as log:
        with pytest.raises(ValueError, match="reserved"):
            log.log(1, {"step": 3.0})
        with pytest.raises(TypeError, match="'name' must be a number"):
            log.log(1, {"name": "grpo"})
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_new_run_refuses_existing_metrics(tmp_path: Path) -> None:
    with quiet_logger(tmp_path) as log:
        log.log(1, {"loss/total": 1.0})
    with pytest.raises(FileExistsError, match="resume_step"):
        quiet_logger(tmp_path)


def test_resume_truncates_later_steps_and_continues_wall_time(tmp_path: Path) -> None:
    with quiet_logger(tmp_path) as log:  # a run of before the metric namespaces: `loss`
        for step in range(1, 6):
            log.log(step, {"loss": float(step)})
    for step in (3, 4, 5):
        save_rollouts(tmp_path, step, [episode(step)])
    # Fake a longer earlier run and a line cut short by kill -9.
    rows = lines(tmp_path)
    rows[2]["wall_time"] = 100.0
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "lo'
    (tmp_path / "metrics.jsonl").write_text(text)

    with quiet_logger(tmp_path, resume_step=3) as log:
        assert log.wall_time >= 100.0
        log.log(4, {"loss/total": 40.0})
    rows = lines(tmp_path)  # the kept rows were rewritten with the new name
    assert [(r["step"], r["loss/total"]) for r in rows] == [(1, 1), (2, 2), (3, 3), (4, 40)]
    assert not any("loss" in r for r in rows)
    assert 100.0 <= rows[-1]["wall_time"] < 160.0
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["step_000003.jsonl"]


def test_tensorboard_events_written(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, console=False) as log:
        log.log(1, {"reward/mean": 0.25, "policy/kl": float("nan")})
        log.log(2, {"reward/mean": 0.5})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["reward/mean"]
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(1, 0.25), (2, 0.5)]


def test_console_line(tmp_path: Path) -> None:
    buf = io.StringIO()
    con = Console(file=buf, width=300, color_system=None)
    with MetricsLogger(tmp_path, tensorboard=False, console=con) as log:
        log.log(
            7,
            {
                "reward/mean": 0.4,
                "reward/std": 0.1,
                "reward/correct": 0.3,
                "policy/kl": 0.0012,
                "policy/entropy": 1.5,
                "policy/clip_frac": 0.02,
                "rollout/tokens_per_s": 812.4,
                "time/generate": 3.21,
                "time/train": 1.0,
                "eval/accuracy": 0.55,
            },
        )
    out = buf.getvalue()
    for piece in (
        "step 7 │ reward 0.400 ± 0.100",
        "correct=0.3",
        "kl 1.20e-03",
        "ent 1.500",
        "clip 0.020",
        "tok/s 812",
        "gen 3.2s train 1.0s",
        "\n  eval at step 7: accuracy=0.55\n",
    ):
        assert piece in out, (piece, out)
    assert out.count("\n") == 2  # the step line, then the held-out evaluation's
    # Absent metrics are left out, not shown as zeros.
    assert format_line(1, {"step": 1}) == "[bold]step 1[/bold]"


def episode(i: int) -> EpisodeResult:
    traj = Trajectory()
    traj.extend([1, 2, 3], sampled=False, turn=0)
    traj.extend([4, 5], sampled=True, turn=0, logprobs=[-0.5, -1.25])
    return EpisodeResult(
        task=Task(id=f"t{i}", prompt=[Message(role="user", content="2+2?")], answer="4"),
        messages=[Message(role="assistant", content="4 ✓")],
        trajectories=[traj],
        reward=float(i),
        rewards={"correct": 1.0},
        timings={"total": 0.5},
        rollout_index=i,
    )


def test_rollouts_round_trip(tmp_path: Path) -> None:
    eps = [episode(i) for i in range(5)]
    path = save_rollouts(tmp_path, 12, eps, limit=3)
    assert path == tmp_path / "rollouts" / "step_000012.jsonl"
    back = [EpisodeResult.from_json(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert back == eps[:3]
    assert save_rollouts(tmp_path, 13, eps).read_text(encoding="utf-8").count("\n") == 5
    assert [p.name for p in (tmp_path / "rollouts").iterdir() if p.name.startswith(".")] == []


def test_read_metrics_skips_broken_lines(tmp_path: Path) -> None:
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "a": 1}\nnot json\n[1]\n{"a": 2}\n{"step": 2, "a": null}\n{"step": 3')
    assert read_metrics(p) == [{"step": 1, "a": 1}, {"step": 2, "a": None}]
    assert read_metrics(tmp_path / "missing.jsonl") == []


def is_png(path: Path) -> bool:
    data = path.read_bytes()
    return len(data) > 1000 and data.startswith(PNG_MAGIC)


FULL_HEIGHT = 1012  # pixels of curves.png with two rows of panels: (3.6 + 2 * 2.8) in at 110 dpi


def png_height(path: Path) -> int:
    """The image height in a PNG's IHDR chunk (bytes 20-24)."""
    return int.from_bytes(path.read_bytes()[20:24], "big")


def test_plot_run_full(tmp_path: Path) -> None:
    with quiet_logger(tmp_path) as log:
        for step in range(1, 41):
            m = {
                "reward/mean": step / 40,
                "reward/std": 0.1,
                "reward/correct": step / 50,
                "policy/kl": 0.001 * step,
                "policy/entropy": 2 - step / 40,
                "policy/clip_frac": float("nan"),
            }
            if step % 10 == 0:
                m |= {"eval/accuracy": step / 40, "eval/turns": 2.0 + step / 20}
            log.log(step, m)
    out = plot_run(tmp_path)
    assert out == tmp_path / "plots" / "curves.png"
    assert is_png(out) and png_height(out) == FULL_HEIGHT  # two rows of panels below the reward
    assert [p.name for p in out.parent.iterdir()] == ["curves.png"]
    panels = plot_panels(read_metrics(tmp_path / "metrics.jsonl"))
    assert panels == [  # the eval count apart from the eval rate; each diagnostic on its own axis
        Panel("held-out evaluation", ("eval/accuracy",), True),
        Panel("eval/turns", ("eval/turns",), False),
        Panel("KL to reference", ("policy/kl",), False),
        Panel("entropy", ("policy/entropy",), False),
    ]  # policy/clip_frac is NaN at every step: no panel


def test_plot_panels_keep_rates_together_without_counts() -> None:
    rows = [{"step": s, "eval/accuracy": s / 4, "eval/format": 1.0} for s in (1, 2, 3)]
    assert plot_panels(rows) == [
        Panel("held-out evaluation", ("eval/accuracy", "eval/format"), False)
    ]
    assert plot_panels([{"step": 1, "loss/total": 0.3}]) == []


def test_plot_panels_draw_the_curriculum_level_and_its_rates_when_logged() -> None:
    rows = [
        {"step": s, "curriculum/level": 1.0 + s // 2, "curriculum/pass_rate": s / 4}
        for s in (1, 2, 3)
    ]  # a curriculum without hints: no curriculum/hint_rate
    assert plot_panels(rows) == [
        Panel("curriculum level", ("curriculum/level",), False),
        Panel("level pass rate, hint rate", ("curriculum/pass_rate",), True),
    ]


def test_band_limits_clip_the_std_band_to_the_reward_range() -> None:
    assert band_limits([np.array([0.2, 0.9]), np.array([1.0])]) == (0.0, 1.0)  # fractions
    assert band_limits([np.array([0.0, 3.5])]) == (0.0, math.inf)  # non-negative counts
    assert band_limits([np.array([-1.0, 1.0])]) == (-math.inf, math.inf)  # signed rewards
    assert band_limits([]) == (-math.inf, math.inf)


@pytest.mark.parametrize(
    "content",
    [
        "",  # nothing logged yet
        '{"step": 1, "wall_time": 0.1, "reward/mean": 0.5}\n',  # one row
        '{"step": 1, "reward/mean": null, "policy/kl": null}\n{"step": 2, "loss/total": 1.0}\n',  # nulls only
        '{"step": 1, "eval/accuracy": 0.5}\n',  # eval only, no reward
    ],
)
def test_plot_run_tolerates_sparse_metrics(tmp_path: Path, content: str) -> None:
    (tmp_path / "metrics.jsonl").write_text(content)
    assert is_png(plot_run(tmp_path))


def test_series_and_smooth() -> None:
    rows: list[dict[str, Any]] = [
        {"step": 3, "x": 3.0},
        {"step": 1, "x": None},
        {"step": 2, "x": float("nan")},
        {"step": 0, "x": 1.0},
        {"step": 4},
    ]
    xs, ys = series(rows, "x")
    assert xs.tolist() == [0.0, 3.0] and ys.tolist() == [1.0, 3.0]
    assert smooth(np.array([1.0, 2.0, 3.0, 4.0]), window=2).tolist() == [1.0, 1.5, 2.5, 3.5]
    assert smooth(np.array([5.0])).tolist() == [5.0]
    assert all(math.isfinite(v) for v in smooth(np.arange(100.0)))


def test_plot_comparison(tmp_path: Path) -> None:
    out = plot_comparison(
        {
            "grpo": [(0, 0.1), (10, 0.5), (20, float("nan")), (30, 0.8)],
            "ppo": [(0, 0.1)],
            "empty": [],
        },
        tmp_path / "cmp" / "acc.png",
        "accuracy vs step",
        "step",
        "accuracy",
        bands={"grpo": [(0, 0.05, 0.15), (10, 0.4, 0.6), (30, 0.7, 0.9)]},
    )
    assert out == tmp_path / "cmp" / "acc.png" and is_png(out)
