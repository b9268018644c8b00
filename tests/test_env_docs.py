"""docs/environments.md: the tutorial's code runs as written (so the tutorial cannot rot)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from helpers import run_episode

from looprl.envs.registry import load_environment
from looprl.types import Message, Task

DOC = Path(__file__).resolve().parents[1] / "docs" / "environments.md"


@pytest.fixture(scope="module")
def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def _module(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    return path


def test_dates_tutorial_and_its_scripted_test(blocks, tmp_path):
    module, snippet = blocks[0], blocks[1]
    assert len(module.splitlines()) <= 75, "the tutorial promises about 60 lines"
    env = load_environment(str(_module(tmp_path, "dates", module)))
    train = {t.prompt[-1].content for t in env.get_tasks("train", 300, 0)}
    assert not train & {t.prompt[-1].content for t in env.get_tasks("eval", 300, 0)}
    namespace = {"load_environment": lambda: env}
    exec(compile(snippet, str(DOC), "exec"), namespace)  # the doc's own assertion must hold
    assert namespace["episode"].rewards == {"correct_answer": 1.0, "used_tool": 1.0}


async def test_hidden_state_example(blocks):
    namespace: dict = {}
    exec(compile(blocks[2], str(DOC), "exec"), namespace)
    from looprl.rubrics import Rubric

    env = namespace["NotesEnv"](name="notes", tools=[namespace["note"]], rubric=Rubric([]))
    assert env.tool_schemas[0]["function"]["parameters"]["properties"].keys() == {"text"}
    task = Task(id="n", prompt=[Message(role="user", content="remember")])
    call = json.dumps({"name": "note", "arguments": {"text": "milk"}})
    ep = await run_episode(env, task, [f"<tool_call>\n{call}\n</tool_call>", "done"])
    assert ep.state["notes"] == ["milk"] and ep.messages[-2].content == "noted (1 so far)"


def test_guess_number_example(blocks, tmp_path):
    env = load_environment(str(_module(tmp_path, "guess", blocks[3])))
    task = env.get_tasks("eval", 1)[0]
    secret = int(task.answer or 0)
    low = 1 if secret != 1 else 2
    ep = asyncio.run(run_episode(env, task, ["hmm", str(low), f"It is {secret}"]))
    assert ep.reward == 1.0 and ep.num_turns == 3 and ep.stop_reason == "done"
    assert ep.messages[-2].content == ("higher" if low < secret else "lower")


def test_mixture_example(blocks):
    namespace: dict = {}
    exec(compile(blocks[4], str(DOC), "exec"), namespace)
    env = namespace["env"]
    assert sorted(t.env for t in env.get_tasks("eval", 4)) == ["calc", "calc", "calc", "wordle"]
