"""A training run whose sync tools hang past `max_hung_tool_calls` stops with one line and
`--resume` carries on from the last checkpoint, losing nothing written before the stop."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import read_metrics

from looprl.cli.main import main

HANG_TRAIN_ENV = """
import os
import time

from looprl import Limits, Message, Rubric, Task, ToolEnv
from looprl.types import ToolCall

CALLS = [0]


def quick() -> str:
    \"\"\"Answer at once.\"\"\"
    return "ok"


def hang() -> str:
    \"\"\"Answer once the test is over (the file $RELEASE_HANG exists).\"\"\"
    while not os.path.exists(os.environ["RELEASE_HANG"]):
        time.sleep(0.05)
    return "released"


class HangAfter(ToolEnv):
    \"\"\"Each episode's set-up calls a tool twice: `quick`, or `hang` after $HANG_AFTER calls.\"\"\"

    async def setup_state(self, task):
        state = await super().setup_state(task)
        for _ in range(2):
            CALLS[0] += 1
            hang_after = int(os.environ.get("HANG_AFTER", "-1"))
            name = "hang" if 0 <= hang_after < CALLS[0] else "quick"
            await self.executor.run([ToolCall(name=name, arguments={}, id="call_0")], state)
        return state


def load_environment(**kwargs):
    def tasks(n, seed):
        return [Task(id=f"t{i}", prompt=[Message(role="user", content="hi")]) for i in range(n)]

    return HangAfter(
        name="hang_after", tools=[quick, hang], rubric=Rubric([]), train_tasks=tasks,
        eval_tasks=tasks, limits=Limits(max_turns=2, max_tokens_per_turn=4),
        tool_timeout=0.2, max_hung_tool_calls=2,
    )
"""


@pytest.mark.slow
def test_train_stops_when_tools_hang_and_resumes(tmp_path: Path, monkeypatch, capsys) -> None:
    """Step 1 answers its 8 calls; in step 2 every call hangs: 4 hang at once, the next call
    finds the limit (2) reached and the run stops: exit 1, one line, the step-1 checkpoint and
    metrics kept, no `final/`. `--resume` (tools answering again) trains steps 2 and 3."""
    env = tmp_path / "hang_after_env.py"
    env.write_text(HANG_TRAIN_ENV)
    args = ["train", "--model.name", "tiny", "--env.name", str(env), "--trainer.steps", "3"]
    args += ["--rollout.tasks_per_step", "2", "--rollout.rollouts_per_task", "2"]
    args += ["--trainer.eval_every", "0", "--trainer.save_every", "1", "--run.tensorboard", "false"]
    args += ["--run.output_dir", str(tmp_path), "--run.name", "hung"]
    run_dir = tmp_path / "hung"
    release = tmp_path / "release"
    monkeypatch.setenv("RELEASE_HANG", str(release))
    monkeypatch.setenv("HANG_AFTER", "8")  # 2 tasks x 2 rollouts x 2 calls in step 1
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert re.match(r"error: [234] sync tool calls hang on their threads, the limit ", err[0])
    assert "hanging: 'hang' " in err[0] and "--resume" in err[0]
    assert [row["step"] for row in read_metrics(run_dir)] == [1]
    assert not (run_dir / "final").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "ToolsHung" in summary["error"]

    monkeypatch.delenv("HANG_AFTER")
    assert main([*args, "--resume"]) == 0
    assert [row["step"] for row in read_metrics(run_dir)] == [1, 2, 3]
    assert (run_dir / "final").is_dir()
    release.touch()  # the hung threads of the first run return
