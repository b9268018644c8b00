"""`looprl init NAME`: scaffold an installable environment package that `looprl eval` runs at once.

The package `NAME/` holds one module `NAME_env.py` with `load_environment` (a small tool
environment to edit), a pyproject that registers it under the `looprl.environments` entry-point
group, a README and a test. Run it as a file (`looprl eval NAME/NAME_env.py`) or install it (`pip install -e NAME`,
then `looprl eval NAME`).
"""

from __future__ import annotations

import keyword
import re
import sys
from pathlib import Path
from string import Template

from looprl.envs.registry import BUILTIN, ENTRY_POINT_GROUP

_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]*$")

_PYPROJECT = Template("""[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "$name"
version = "0.1.0"
description = "A looprl environment: count letters with a tool."
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["looprl"]

[project.entry-points."$group"]
$name = "$module:load_environment"

[tool.setuptools]
py-modules = ["$module"]

[tool.pytest.ini_options]
pythonpath = ["."]
""")

_MODULE = Template('''"""$name: count letters in made-up words with a `count_letter` tool (a looprl environment)."""

from __future__ import annotations

import random
import re
from typing import Any

from looprl import (
    EpisodeResult,
    Limits,
    Message,
    Rubric,
    Task,
    ToolEnv,
    final_reply,
    split_of,
    used_tool,
)

SYSTEM_PROMPT = "Use the count_letter tool, then reply with 'The answer is N.'"


def count_letter(word: str, letter: str) -> int:
    """Count how many times a letter occurs in a word.

    Args:
        word: The word to look at.
        letter: One letter.
    """
    if len(letter) != 1:
        raise ValueError(f"letter must be a single character, got {letter!r}")
    return word.lower().count(letter.lower())


def make_tasks(split: str, n: int, seed: int) -> list[Task]:
    """`n` tasks of a split; a hash of the word sends one word in five to `eval`."""
    rng = random.Random(f"$name-{split}-{seed}")
    tasks: dict[str, Task] = {}
    while len(tasks) < n:
        word = "".join(rng.choice("abdeilmnorstu") for _ in range(rng.randint(8, 14)))
        if split_of(word) != split:
            continue
        letter = rng.choice(word)
        question = f"How many times does the letter '{letter}' occur in '{word}'?"
        prompt = [Message(role="user", content=question)]
        answer = str(word.count(letter))
        tasks[question] = Task(id=f"$name-{word}-{letter}", prompt=prompt, answer=answer)
    return list(tasks.values())


def correct_answer(episode: EpisodeResult) -> float:
    """1.0 when the last reply says 'The answer is N' with the right N (the reward)."""
    match = re.search(r"answer is\\s*(\\d+)", final_reply(episode))
    return float(match is not None and match.group(1) == episode.task.answer)


def load_environment(**kwargs: Any) -> ToolEnv:
    """The $name environment; keyword arguments go to `ToolEnv` (e.g. `limits=`)."""
    return ToolEnv(
        name="$name",
        tools=[count_letter],
        rubric=Rubric([correct_answer, used_tool], weights=[1.0, 0.0]),  # used_tool: a metric
        train_tasks=lambda n, seed: make_tasks("train", n, seed),
        eval_tasks=lambda n, seed: make_tasks("eval", n, seed),
        limits=kwargs.pop("limits", Limits(max_turns=3, max_tokens_per_turn=96)),
        system_prompt=kwargs.pop("system_prompt", SYSTEM_PROMPT),
        **kwargs,
    )
''')

_TEST = Template('''"""Tests for $name: splits, the tool, the reward, one scripted episode and `looprl env check`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import $module
from looprl.cli.main import main
from looprl.engines.scripted import ScriptedEngine
from looprl.rollout.loop import rollout


def test_splits_never_overlap():
    train = {t.prompt[-1].content for t in $module.make_tasks("train", 300, 0)}
    test = {t.prompt[-1].content for t in $module.make_tasks("eval", 300, 0)}
    assert len(train) == len(test) == 300 and not train & test


def test_tool_counts_letters():
    assert $module.count_letter("Banana", "a") == 3


def test_scripted_episode_earns_the_reward():
    env = $module.load_environment()
    task = env.get_tasks("eval", 1)[0]
    question = task.prompt[-1].content
    word, letter = question.split("'")[3], question.split("'")[1]
    call = {"name": "count_letter", "arguments": {"word": word, "letter": letter}}
    script = [f"<tool_call>\\n{json.dumps(call)}\\n</tool_call>", f"The answer is {task.answer}."]
    episode = asyncio.run(rollout(env, ScriptedEngine(script), task, renderer=None))
    asyncio.run(env.rubric.score(episode))
    assert episode.messages[-2].content == task.answer  # the tool's result
    assert episode.reward == 1.0 and episode.rewards["used_tool"] == 1.0


def reference(turn) -> str:
    """`looprl env check`'s reference policy: count_letter on the task's word, then the count."""
    if not turn.tool_results:
        _, letter, _, word, _ = turn.task.prompt[-1].content.split("'")
        call = {"name": "count_letter", "arguments": {"word": word, "letter": letter}}
        return f"<tool_call>\\n{json.dumps(call)}\\n</tool_call>"
    return f"The answer is {turn.tool_results[-1].strip()}."


def test_env_check_passes_strict():
    """Token-exact episodes, isolated state, seeded tasks, valid tool schemas, a rubric that tells
    the reference from a wrong answer, the probe; drop --no-train to add a 2-step train smoke."""
    here = Path(__file__).resolve()
    env_file = here.parents[1] / "$module.py"
    argv = ["env", "check", str(env_file), "--reference", f"{here}:reference", "--no-train"]
    assert main([*argv, "--strict"]) == 0
''')

_README = Template("""# $name

A looprl environment made with `looprl init $name`: the model counts letters in made-up words with a `count_letter` tool and ends with "The answer is N.".
Edit `$module.py`: the tasks (`make_tasks`), the tools, and the reward functions of the rubric.

```bash
looprl eval $name/$module.py -n 20   # run it as a file, from this folder's parent
pip install -e $name                  # or install it (registers the entry point) ...
looprl eval $name -n 20               # ... and run it by name from anywhere
looprl env list                       # it is listed with its version and package
python -m pytest $name                # its tests
```

Pass arguments of `load_environment` from the command line: `looprl eval $name --env.KEY VALUE`.
""")


def _check_name(name: str) -> str:
    """The module name for a package name, or a ValueError saying what to change."""
    if not _NAME_RE.match(name):
        raise ValueError(
            f"environment name {name!r} must start with a lower-case letter and hold only "
            "lower-case letters, digits, '-' and '_' (e.g. 'letter-count')"
        )
    snake = name.replace("-", "_")
    if keyword.iskeyword(snake) or snake in sys.stdlib_module_names or snake in ("looprl", "tests"):
        raise ValueError(f"{name!r} would shadow the Python module {snake!r}; choose another name")
    if name in BUILTIN or snake in BUILTIN:
        raise ValueError(f"{name!r} is a built-in looprl environment; choose another name")
    # The module must not share the folder's name: run from the folder's parent (a notebook,
    # `python -m`), the folder would be imported as a namespace package instead of the module.
    return f"{snake}_env"


def scaffold(name: str, dest: Path) -> Path:
    """Create the environment package `dest/name/` and return its path.

    Raises FileExistsError when `dest/name` exists and is not empty (nothing is overwritten).
    """
    module = _check_name(name)
    root = Path(dest) / name
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(
            f"{root} already exists and is not empty; choose another name or folder"
        )
    values = {"name": name, "module": module, "group": ENTRY_POINT_GROUP}
    files = {
        root / "pyproject.toml": _PYPROJECT,
        root / f"{module}.py": _MODULE,
        root / "README.md": _README,
        root / "tests" / f"test_{module}.py": _TEST,
    }
    for path, template in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.substitute(values), encoding="utf-8")
    return root
