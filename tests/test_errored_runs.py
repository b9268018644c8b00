"""Runs in which errors leave nothing to score or train say so and end in error: a training batch
of infra errors is `skipped` (never promised to a `--resume`), counted as `train/error_skipped`;
skipped steps in a row stop the run, a run that never updated exports no `final/`, and an
evaluation whose every episode is a scoring error fails with one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import read_metrics, small_config

from looprl.cli.main import main
from looprl.engines.base import Generation
from looprl.safe_json import loads_strict
from looprl.trainer import collect as C
from looprl.trainer import trainer as T
from looprl.trainer.progress import ERROR_SKIPPED_KEY, ErroredBatches, no_gradient
from looprl.types import EpisodeResult, Message, Task

LENGTH_ENV = str(Path(__file__).parent / "envs" / "length_env.py")

SCORING_ERROR_ENV = """
from looprl import Limits, Rubric, SingleTurnEnv, Task, Message

def broken_reward(episode):
    raise KeyError("answer")

def load_environment(**kwargs):
    def tasks(n, seed):
        return [Task(id=f"t{i}", prompt=[Message(role="user", content="hi")]) for i in range(n)]
    return SingleTurnEnv(name="broken", rubric=Rubric([broken_reward]), train_tasks=tasks,
                         eval_tasks=tasks, limits=Limits(max_turns=1, max_tokens_per_turn=4))
"""


def _episode(task: str, errors: list[dict[str, Any]] | None = None) -> EpisodeResult:
    ep = EpisodeResult(task=Task(id=task, prompt=[Message(role="user", content="q")]))
    ep.errors = errors or []
    return ep


INFRA = {"kind": "infra", "message": "engine: server gone"}


def test_a_batch_of_infra_errors_is_said_skipped_and_counted(tmp_path) -> None:
    said: list[str] = []
    guard = ErroredBatches(3, tmp_path, said.append)
    groups = [
        [_episode("a", [INFRA]), _episode("a", [INFRA])],
        [_episode("b"), _episode("b", [INFRA])],
    ]
    skipped = {"train/skipped": 1.0, "train/groups_used": 0.0}
    assert guard.observe(4, skipped, groups) == {ERROR_SKIPPED_KEY: 1.0}
    assert said == [
        "step 4: batch skipped (3 of 4 episodes were infra errors; first: infra: engine: server "
        "gone) — no update ran"
    ]
    assert not no_gradient({**skipped, ERROR_SKIPPED_KEY: 1.0})  # not "uniform rewards"
    # a uniform batch (groups used, nothing errored) is no error skip, and says nothing here
    clean = [[_episode("c"), _episode("c")]]
    assert guard.observe(5, {"train/skipped": 1.0, "train/groups_used": 1.0}, clean) == {
        ERROR_SKIPPED_KEY: 0.0
    }
    assert len(said) == 1


def test_a_batch_that_trained_on_survivors_says_so_without_promising_a_resume(tmp_path) -> None:
    said: list[str] = []
    guard = ErroredBatches(3, tmp_path, said.append)
    scoring = {"kind": "scoring", "message": "KeyError", "function": "f"}
    groups = [[_episode("a", [INFRA]), _episode("a", [scoring])], [_episode("b"), _episode("b")]]
    assert guard.observe(1, {"train/groups_used": 1.0}, groups) == {ERROR_SKIPPED_KEY: 0.0}
    assert said == [
        "step 1: 2 of 4 episodes errored: 1 infra, 1 scoring; the update could use only the 2 "
        "that did not (first error: infra: engine: server gone)"
    ]
    assert "resume" not in said[0]


def test_skipped_steps_in_a_row_stop_and_a_good_one_resets(tmp_path) -> None:
    guard = ErroredBatches(2, tmp_path, lambda _: None)
    bad = [[_episode("a", [INFRA]), _episode("a", [INFRA])]]
    good = [[_episode("a"), _episode("a")]]
    skipped = {"train/skipped": 1.0, "train/groups_used": 0.0}
    guard.observe(1, skipped, bad)
    guard.stop_if_stuck(1)
    guard.observe(2, {"train/groups_used": 1.0}, good)
    guard.stop_if_stuck(2)
    guard.observe(3, skipped, bad)
    guard.stop_if_stuck(3)
    guard.check_trained()  # step 2 updated
    guard.observe(4, skipped, bad)
    with pytest.raises(SystemExit) as stop:
        guard.stop_if_stuck(4)
    line = str(stop.value.code)
    assert line.startswith("error: step 4: 2 steps in a row were skipped") and "\n" not in line
    assert "--resume" in line and "trainer.max_skipped_steps" in line


def _fail_on_steps(monkeypatch: pytest.MonkeyPatch, steps: set[int]) -> None:
    """The engine answers every request of the training steps in `steps` with an error (a dead
    server): each of their episodes is an infra error."""
    real = C.run_groups
    calls = {"n": 0}

    class DeadServer:
        def __init__(self, engine: Any) -> None:
            self.engine = engine

        async def generate(self, request: Any) -> Generation:
            return Generation(text="", finish_reason="error", error="connection refused")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.engine, name)

    def run_groups(env: Any, engine: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1  # one call per training step (no dynamic sampling, nothing ahead)
        return real(env, DeadServer(engine) if calls["n"] in steps else engine, *args, **kwargs)

    monkeypatch.setattr(C, "run_groups", run_groups)


@pytest.mark.slow
def test_a_step_of_infra_errors_is_skipped_truthfully_and_the_run_goes_on(
    tmp_path, monkeypatch, capsys
) -> None:
    _fail_on_steps(monkeypatch, {2})
    cfg = small_config(tmp_path, "blip", **{"trainer.steps": 3, "trainer.save_every": 3})
    T.Trainer(cfg).run()
    out = capsys.readouterr().out
    assert "step 2: batch skipped (4 of 4 episodes were infra errors; first: infra: engine: " in out
    assert "--resume" not in out and "runs them again" not in out
    rows = read_metrics(tmp_path / "blip")
    assert [r[ERROR_SKIPPED_KEY] for r in rows] == [0.0, 1.0, 0.0]
    assert [r["rollout/infra_errors"] for r in rows] == [0.0, 4.0, 0.0]
    assert (tmp_path / "blip" / "final" / "config.json").is_file()


@pytest.mark.slow
def test_skipped_steps_in_a_row_stop_train_with_one_line_and_no_final(
    tmp_path, monkeypatch, capsys
) -> None:
    _fail_on_steps(monkeypatch, {1, 2, 3, 4})
    run = tmp_path / "dead"
    argv = ["train", "--model.name", "tiny", "--env.name", LENGTH_ENV, "--run-dir", str(run)]
    argv += ["--rollout.tasks_per_step", "2", "--rollout.rollouts_per_task", "2"]
    argv += ["--trainer.steps", "4", "--trainer.eval_every", "0", "--trainer.save_every", "1"]
    argv += ["--trainer.max_skipped_steps", "2", "--run.tensorboard", "false"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: step 2: 2 steps in a row were skipped")
    assert "Traceback" not in err[0]
    assert [r[ERROR_SKIPPED_KEY] for r in read_metrics(run)] == [1.0, 1.0]
    assert not (run / "final").exists()
    assert loads_strict((run / "summary.json").read_text())["status"] == "failed"


@pytest.mark.slow
def test_a_run_that_never_updated_exports_nothing(tmp_path, monkeypatch) -> None:
    _fail_on_steps(monkeypatch, {1, 2})
    trainer = T.Trainer(small_config(tmp_path, "never"))  # 2 steps, the limit is 3
    with pytest.raises(SystemExit) as stop:
        trainer.run()
    line = str(stop.value.code)
    assert line.startswith("error: no step of this run updated the model: all 2 were skipped")
    assert "final/ was not exported" in line and "\n" not in line
    assert not (tmp_path / "never" / "final").exists()
    assert (tmp_path / "never" / "checkpoints" / "step_000002").is_dir()  # resumable


def test_an_eval_whose_every_episode_is_a_scoring_error_fails(tmp_path, capsys) -> None:
    env = tmp_path / "broken_env.py"
    env.write_text(SCORING_ERROR_ENV)
    out = tmp_path / "ev"
    argv = ["eval", str(env), "--policy", "looprl.sft.teachers:calculator", "-n", "2", "-r", "2"]
    assert main([*argv, "--output", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        "error: no episode could be scored: 4 scoring errors, first: scoring in broken_reward: "
    )
    assert "KeyError" in err[0] and "Traceback" not in err[0]
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
    assert json.loads((out / "metadata.json").read_text())["status"] == "failed"
    assert len((out / "results.jsonl").read_text().splitlines()) == 4  # the episodes are kept
