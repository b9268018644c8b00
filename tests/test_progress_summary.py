"""Progress in a log (eval lines, the phases of a long training step), the no-gradient warning,
and the `summary.json` that `looprl eval` and `looprl train` leave at their end."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import small_config
from rich.console import Console

from looprl.console import ProgressLines
from looprl.safe_json import loads_strict
from looprl.trainer.logger import MetricsLogger, format_line
from looprl.trainer.progress import NoGradientWarning, StepPhases, no_gradient
from looprl.trainer.run_summary import write_run_summary

CONSTANT_ENV = str(Path(__file__).parent / "envs" / "constant_env.py")
ROOT = Path(__file__).resolve().parents[1]


class Clock:
    """A hand-driven clock: `now` seconds, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _log_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=120, color_system=None), buf


def test_progress_lines_every_tenth_or_every_30_s() -> None:
    con, buf = _log_console()
    clock = Clock()
    lines = ProgressLines("eval", 40, out=con, clock=clock)
    for i in range(40):
        clock.now = i * 0.5
        lines.advance(1, f"reward {i / 40:.3f}")
    out = buf.getvalue().splitlines()
    assert len(out) == 10  # every 4 of 40
    assert out[0] == "eval: 4/40 episodes, reward 0.075, 2 s"
    assert out[-1] == "eval: 40/40 episodes, reward 0.975, 20 s"

    con, buf = _log_console()
    clock.now = 0.0
    slow = ProgressLines("eval", 1000, out=con, clock=clock)  # a line every 100 episodes, or 30 s
    slow.advance(3)
    clock.now = 31.0
    slow.advance(1)
    slow.advance(1)  # 0 s since the last line, 1 episode: quiet
    slow.finish()  # the count of 5 has no line yet
    assert buf.getvalue().splitlines() == [
        "eval: 4/1000 episodes, 31 s",
        "eval: 5/1000 episodes, 31 s",
    ]


def test_a_40_episode_eval_piped_to_a_file_shows_progress_and_writes_summary(tmp_path) -> None:
    out, log = tmp_path / "ev", tmp_path / "eval.log"
    cmd = [sys.executable, "-m", "looprl", "eval", "calculator"]
    cmd += ["--policy", "looprl.sft.teachers:calculator", "-n", "40", "-r", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    with log.open("w") as f:  # stdout is a file, not a terminal
        proc = subprocess.run(
            cmd + ["--output", str(out)], stdout=f, stderr=subprocess.STDOUT, env=env, timeout=300
        )
    text = log.read_text()
    assert proc.returncode == 0, text
    progress = [line for line in text.splitlines() if line.startswith("eval: ")]
    assert len(progress) == 10 and progress[-1].startswith("eval: 40/40 episodes, reward 1.000")
    summary = loads_strict((out / "summary.json").read_text())
    meta = json.loads((out / "metadata.json").read_text())
    assert summary["status"] == "finished" and summary["episodes"] == 40
    assert {k: summary[k] for k in meta["summary"]} == meta["summary"]  # the printed summary
    assert f"summary: {out / 'summary.json'}" in text
    assert not list(out.glob(".summary.json.tmp-*"))


def test_step_phases_stay_quiet_on_short_steps_and_show_long_ones() -> None:
    con, buf = _log_console()
    clock = Clock()
    phases = StepPhases(10, out=con, clock=clock, quiet_s=10.0)
    phases.begin(1)
    for phase, seconds in (("generating", 2.0), ("training", 3.0), ("evaluating", 1.0)):
        phases.enter(phase)
        clock.now += seconds
    phases.end()
    assert buf.getvalue() == ""  # a 6 s step says nothing
    phases.begin(2)
    phases.enter("generating")
    clock.now += 42.0
    phases.enter("training")  # the step has run 42 s: say where it is
    clock.now += 5.0
    phases.end()
    phases.begin(3)  # the last step was long: every phase of this one is shown from its start
    phases.enter("generating")
    clock.now += 1.0
    phases.enter("training")
    phases.end()
    assert buf.getvalue().splitlines() == [
        "step 2/10: training (generating took 42 s)",
        "step 3/10: generating",
        "step 3/10: training (generating took 1 s)",
    ]
    silent = StepPhases(10, out=None, clock=clock, quiet_s=0.0)  # a rank other than 0
    silent.begin(1)
    silent.enter("generating")
    silent.end()


def test_no_gradient_is_warned_once_and_always_on_the_step_line(tmp_path) -> None:
    uniform = {"reward/mean": 0.0, "train/zero_var_frac": 1.0, "loss/total": 0.0}
    assert no_gradient(uniform) and no_gradient({"train/skipped": 1.0})
    assert not no_gradient({"train/zero_var_frac": 0.5})
    warnings: list[str] = []
    warner = NoGradientWarning(4, warnings.append)
    warner.check(1, {"train/zero_var_frac": 0.5})
    warner.check(2, uniform)
    warner.check(3, uniform)
    assert len(warnings) == 1 and warnings[0].startswith("step 2 had no gradient")
    assert "--rollout.rollouts_per_task 8" in warnings[0] and "looprl sft" in warnings[0]
    row = {"step": 2, "wall_time": 1.0, **uniform}
    narrow = format_line(2, row, total=10, width=40)  # the optional metrics do not fit; it does
    assert "no gradient" in narrow
    assert "no gradient" not in format_line(2, {"step": 2, "train/zero_var_frac": 0.5})


def test_run_summary_reads_the_metrics_and_is_strict_json(tmp_path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False, console=False) as log:
        log.log(0, {"eval/reward": 0.25})
        log.log(1, {"reward/mean": 0.5, "eval/reward": 0.75})
        log.log(2, {"reward/mean": float("nan"), "eval/reward": 0.5})
    (tmp_path / "final").mkdir()
    path = write_run_summary(tmp_path, status="finished", steps=2, seconds=12.3456)
    summary = loads_strict(path.read_text())
    assert summary["status"] == "finished" and summary["error"] is None
    assert (summary["step"], summary["steps"], summary["seconds"]) == (2, 2, 12.346)
    assert summary["eval"] == {
        "last": {"step": 2, "reward": 0.5},
        "best": {"step": 1, "reward": 0.75},
    }
    assert summary["last_metrics"]["reward/mean"] is None  # NaN is written as null
    assert summary["paths"]["final"] == str(tmp_path / "final")
    assert summary["paths"]["metrics"] == str(tmp_path / "metrics.jsonl")
    empty = tmp_path / "empty"
    empty.mkdir()
    write_run_summary(empty, status="failed", steps=5, seconds=0.1, error="RuntimeError: boom")
    summary = loads_strict((empty / "summary.json").read_text())
    assert (summary["step"], summary["eval"], summary["paths"]["final"]) == (0, None, None)
    assert summary["error"] == "RuntimeError: boom"


@pytest.mark.slow
def test_a_run_whose_groups_are_all_uniform_warns_once_and_writes_its_summary(
    tmp_path, capsys
) -> None:
    from looprl.trainer.trainer import Trainer

    cfg = small_config(tmp_path, "flat", **{"env.name": CONSTANT_ENV, "trainer.steps": 2})
    Trainer(cfg).run()
    out = capsys.readouterr().out
    assert out.count("had no gradient") == 1, out  # once per run, not once per step
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all("no gradient" in line for line in steps), steps
    summary = loads_strict((tmp_path / "flat" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 2
    assert summary["paths"]["final"] == str(tmp_path / "flat" / "final")
    assert summary["last_metrics"]["train/zero_var_frac"] == 1.0


@pytest.mark.slow
def test_an_interrupted_run_says_so_in_its_summary(tmp_path, monkeypatch) -> None:
    from looprl.trainer.trainer import Trainer

    def interrupt(self, groups):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_update", interrupt)
    cfg = small_config(tmp_path, "cut", **{"env.name": CONSTANT_ENV, "trainer.steps": 1})
    with pytest.raises(KeyboardInterrupt):
        Trainer(cfg).run()
    summary = loads_strict((tmp_path / "cut" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["step"] == 0
    assert summary["paths"]["final"] is None
