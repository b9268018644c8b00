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


def _alike(frac: float, right: float, wrong: float, groups: int = 16) -> dict[str, float]:
    """A step's group metrics: `frac` of `groups` scored alike, `right` all solved, `wrong` none."""
    return {
        "train/groups_used": float(groups), "train/zero_var_frac": frac,
        "train/groups_all_correct_frac": right, "train/groups_all_wrong_frac": wrong,
    }  # fmt: skip


def test_no_gradient_is_warned_once_per_streak_and_always_on_the_step_line(tmp_path) -> None:
    uniform = {"reward/mean": 0.0, "loss/total": 0.0, **_alike(1.0, 0.0, 1.0)}
    assert no_gradient(uniform) and no_gradient({"train/skipped": 1.0})
    assert not no_gradient({"train/zero_var_frac": 0.5})
    warnings: list[str] = []
    warner = NoGradientWarning(4, warnings.append)
    warner.check(1, _alike(0.25, 0.0, 0.25))  # most groups teach: no streak
    warner.check(2, {**uniform, "train/uniform_steps_skipped": 1.0})  # no gradient: at once
    warner.check(3, uniform)  # the same streak: said already
    assert warnings == [
        "step 2: 16 of 16 groups scored alike (no learning signal from them: 0 all solved, 16 "
        "all failed; no update ran): raise rollout.rollouts_per_task (--rollout.rollouts_per_task 8), "
        "add a curriculum section of easier tasks, or warm-start with `looprl bootstrap` (or "
        "`looprl sft` on traces)"
    ]
    row = {"step": 2, "wall_time": 1.0, **uniform}
    narrow = format_line(2, row, total=10, width=40)  # the optional metrics do not fit; it does
    assert "no gradient" in narrow
    assert "no gradient" not in format_line(2, {"step": 2, "train/zero_var_frac": 0.5})


def test_a_streak_of_mostly_alike_steps_is_warned_at_its_third_step_with_its_fix() -> None:
    warnings: list[str] = []
    warner = NoGradientWarning(4, warnings.append)
    easy = _alike(0.75, 0.625, 0.125)  # 12 of 16 alike: 10 all solved, 2 none
    warner.check(1, easy)
    warner.check(2, easy)
    assert warnings == []  # two steps are not a streak yet
    warner.check(3, easy)
    warner.check(4, easy)
    assert warnings == [
        "step 3: 12 of 16 groups scored alike for 3 steps (no learning signal from them: 10 all "
        "solved, 2 all failed): the tasks are too easy for the model: train on harder ones (a "
        "curriculum section keeps them at its level)"
    ]
    warner.check(5, _alike(0.25, 0.25, 0.0))  # the streak ends; the next one is warned again
    for step in (6, 7, 8):
        warner.check(step, _alike(0.5, 0.0, 0.5))
    assert len(warnings) == 2 and warnings[1].startswith(
        "step 8: 8 of 16 groups scored alike for 3"
    )
    assert "looprl bootstrap" in warnings[1]  # all failed: easier tasks, bigger groups, warm start
    warner.finish()  # 7 of 8 steps had most groups alike: one line at the end
    assert warnings[2] == (
        "7 of this run's 8 steps had most groups scored alike (0 with no learning signal at all; "
        "alike groups: 44 all solved, 32 all failed): the tasks are too easy for the model: train on "
        "harder ones (a curriculum section keeps them at its level)"
    )
    quiet = NoGradientWarning(4, warnings.append)
    quiet.check(1, easy)
    quiet.check(2, _alike(0.0, 0.0, 0.0))
    quiet.finish()  # half the steps: no end-of-run line
    assert len(warnings) == 3


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
    out = " ".join(capsys.readouterr().out.split())  # a warning may wrap
    assert out.count("groups scored alike (no learning signal") == 1, out  # once per streak
    assert "2 of this run's 2 steps had most groups scored alike" in out  # and once at the end
    assert "curriculum section of easier tasks" in out  # all failed alike: the fixes for that
    steps = [line for line in out.split(" step ")[1:] if line.startswith(("1/2", "2/2"))]
    assert len(steps) == 2 and all("no gradient" in line for line in steps), steps
    summary = loads_strict((tmp_path / "flat" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 2
    assert summary["paths"]["final"] == str(tmp_path / "flat" / "final")
    last = summary["last_metrics"]
    assert last["train/zero_var_frac"] == 1.0 and last["train/groups_all_wrong_frac"] == 1.0
    assert last["train/uniform_steps_skipped"] == 0.0  # trainer.skip_uniform_steps: false
    over = {"env.name": CONSTANT_ENV, "trainer.steps": 1, "trainer.skip_uniform_steps": True}
    Trainer(small_config(tmp_path, "skipping", **over)).run()
    summary = loads_strict((tmp_path / "skipping" / "summary.json").read_text())
    assert summary["last_metrics"]["train/uniform_steps_skipped"] == 1.0


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
