"""The trainer and `looprl eval` close the environment (MCP servers, ...) on every exit path."""

from __future__ import annotations

import textwrap

import pytest

from looprl.cli.main import main

ENV = textwrap.dedent(
    '''
    """A length environment that records `close()` in a file next to it."""
    from pathlib import Path

    from looprl.envs.base import Limits, SingleTurnEnv
    from looprl.rubrics import Rubric
    from looprl.types import Message, Task

    MARK = Path(__file__).with_suffix(".closed")


    class ClosingEnv(SingleTurnEnv):
        def close(self):
            MARK.write_text(str(int(MARK.read_text() or 0) + 1) if MARK.exists() else "1")


    def tasks(n, seed):
        return [Task(id=f"t{i}", prompt=[Message(role="user", content="say hi")]) for i in range(n)]


    def broken(n, seed):
        raise RuntimeError("the task source broke mid-run")


    def load_environment(explode: bool = False):
        def reward(episode):
            return 1.0

        return ClosingEnv(
            name="closing", rubric=Rubric([reward]), train_tasks=broken if explode else tasks,
            eval_tasks=tasks,
            limits=Limits(max_turns=1, max_tokens_per_turn=4),
        )
    '''
)


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "closing_env.py"
    path.write_text(ENV)
    (tmp_path / "policy.py").write_text("def hi(messages):\n    return 'hi'\n")
    return path


def test_eval_closes_the_environment(env_file, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["eval", str(env_file), "--policy", f"{tmp_path / 'policy.py'}:hi", "-n", "2", "-r", "1"]
    assert main(argv) == 0
    assert env_file.with_suffix(".closed").read_text() == "1"


def test_a_training_run_closes_the_environment_even_when_it_crashes(env_file, tmp_path) -> None:
    from looprl.trainer.config import load_config
    from looprl.trainer.trainer import Trainer

    overrides = {
        "model.name": "tiny", "env.name": str(env_file), "rollout.tasks_per_step": 2,
        "rollout.rollouts_per_task": 2, "trainer.steps": 1, "trainer.eval_every": 0,
        "trainer.eval_tasks": 2, "run.output_dir": str(tmp_path / "runs"),
        "run.tensorboard": False,
    }  # fmt: skip
    Trainer(load_config(None, overrides)).run()
    assert env_file.with_suffix(".closed").read_text() == "1"
    overrides["env.kwargs"] = {"explode": True}
    overrides["run.name"] = "interrupted"
    with pytest.raises(RuntimeError, match="broke mid-run"):
        Trainer(load_config(None, overrides)).run()
    assert env_file.with_suffix(".closed").read_text() == "2"
