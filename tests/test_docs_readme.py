"""The README's environment is real: extracted from README.md, loaded by path, played by a script."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from helpers import run_episode

from looprl.envs.registry import load_environment

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_environment() -> str:
    """The first ```python block of the README: the whole environment file it shows."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "README.md shows no ```python block; the environment example is missing"
    return blocks[0]


def test_readme_environment_is_short_imports_looprl_alone_and_comes_before_any_table():
    code = _readme_environment()
    assert len(code.splitlines()) <= 20, "the README promises an environment in <= 20 lines"
    imports = re.findall(r"^(?:from (\S+) import|import (\S+))", code, flags=re.M)
    assert [a or b for a, b in imports] == ["looprl"], imports
    text = README.read_text(encoding="utf-8")
    first_table = re.search(r"^\|", text, flags=re.M)
    assert first_table is None or text.index("```python") < first_table.start()


def test_readme_commands_are_the_two_set_up_commands():
    text = README.read_text(encoding="utf-8")
    assert re.search(r"^make demo\b", text, flags=re.M) and re.search(
        r"^make test\b", text, flags=re.M
    )


def test_readme_environment_runs_a_scripted_episode_to_full_reward(tmp_path):
    path = tmp_path / "adder.py"
    path.write_text(_readme_environment(), encoding="utf-8")
    env = load_environment(str(path))
    assert not {t.id for t in env.get_tasks("train", 80, 0)} & {
        t.id for t in env.get_tasks("eval", 20, 0)
    }
    task = env.get_tasks("eval", 1, 0)[0]
    a, b = (int(n) for n in re.findall(r"\d+", task.prompt[-1].content))
    call = json.dumps({"name": "add", "arguments": {"a": a, "b": b}})
    script = [f"<tool_call>\n{call}\n</tool_call>", f"The sum is {a + b}."]
    episode = asyncio.run(run_episode(env, task, script))
    assert episode.messages[-2].content == str(a + b)  # the tool ran and its result came back
    assert episode.rewards == {"correct": 1.0, "used_tool": 1.0} and episode.reward == 1.0
    wrong = asyncio.run(run_episode(env, task, [f"The sum is {a + b + 1}."]))
    assert wrong.rewards == {"correct": 0.0, "used_tool": 0.0}
