"""`looprl env check`: a sound environment passes --strict, three broken ones fail with the reason.

The environments are written here: a basket the model fills with a `put` tool and whose total it
reports. `load_environment(kind=...)` builds the sound one or one broken three ways: the basket
kept in the tool's closure (shared by every episode), tasks drawn from the global random module
(not the seed), and a rubric that pays the answer format, not the answer.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Annotated, Any

import pytest

from looprl import EpisodeResult, Hidden, Limits, Message, Rubric, SingleTurnEnv, Task, ToolEnv
from looprl.cli.main import main
from looprl.probe import ProbeProfile, Turn, tool_call_text
from looprl.probe.check import CheckContext, Outcome, check_tool_schemas, schema_problems

HERE = str(Path(__file__))
_ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def make_tasks(n: int, seed: int, rng: Any = None) -> list[Task]:
    """'Put K apples in the basket': K from `rng`, else from random.Random(seed)."""
    rng = rng or random.Random(seed)
    tasks = []
    for i in range(n):
        k = rng.randint(1, 9)
        prompt = f"Put {k} apples in the basket with the put tool, then say how many it holds."
        tasks.append(Task(id=f"{seed}-{i}", prompt=[Message(role="user", content=prompt)],
                          answer=str(k)))  # fmt: skip
    return tasks


def put(count: int, basket: Annotated[list, Hidden("basket")]) -> str:
    """Put apples in the basket; returns how many it holds.

    Args:
        count: apples to add.
    """
    basket.append(count)
    return str(sum(basket))


SHARED: list[int] = []


def put_shared(count: int) -> str:
    """Put apples in the basket; returns how many it holds.

    Args:
        count: apples to add.
    """
    SHARED.append(count)
    return str(sum(SHARED))


def correct(episode: EpisodeResult) -> float:
    """1 when the last `<answer>` holds the task's answer."""
    found = _ANSWER.findall(episode.messages[-1].content)
    return float(bool(found) and found[-1] == episode.task.answer)


def tagged(episode: EpisodeResult) -> float:
    """1 for any `<answer>` tag (the broken rubric: it cannot tell right from wrong)."""
    return float(bool(_ANSWER.search(episode.messages[-1].content)))


class PutThenAnswer:
    """Puts the task's apples, then answers with the total the tool reported."""

    def reply(self, turn: Turn) -> str:
        """The tool call first, then the tool's total in `<answer>` tags."""
        if not turn.tool_results:
            return tool_call_text(turn.tools[0]["function"]["name"], {"count": int(turn.answer)})
        return turn.fmt(turn.tool_results[-1].strip())


class Basket(ToolEnv):
    """Each episode's basket is its own list in the episode state."""

    probe_profile = ProbeProfile(
        "<answer>{}</answer>",
        reference=PutThenAnswer(),
        accepted={"copy_tool_result": "the put tool reports the total: reading it is the task"},
    )

    async def setup_state(self, task: Task) -> dict[str, Any]:
        """The base state plus an empty basket."""
        return {**await super().setup_state(task), "basket": []}


def random_tasks(n: int, seed: int) -> list[Task]:
    """The broken task source: K drawn from the global random module, whatever the seed."""
    return make_tasks(n, seed, random)


def load_environment(kind: str = "sound") -> ToolEnv:
    """The basket environment, sound or or broken one way: shared_state, random_tasks, blind_rubric."""
    tasks = random_tasks if kind == "random_tasks" else make_tasks
    return Basket(
        name=f"basket_{kind}", tools=[put_shared if kind == "shared_state" else put],
        rubric=Rubric([tagged if kind == "blind_rubric" else correct]),
        train_tasks=tasks, eval_tasks=tasks, limits=Limits(max_turns=3, max_tokens_per_turn=64),
        system_prompt="Use the put tool, then answer like <answer>N</answer>.",
    )  # fmt: skip


def check(kind: str, *flags: str) -> list[str]:
    """`looprl env check` on this file's environment of `kind`, without the train smoke."""
    return ["env", "check", HERE, "--env.kind", kind, "--tasks", "3", "--no-train", *flags]


def test_the_sound_basket_passes_strict(capsys):
    assert main(check("sound", "--strict")) == 0
    out = capsys.readouterr().out
    assert "every check passed" in out and "FAIL" not in out
    assert "token-exact" in out and "match a lone episode" in out


@pytest.mark.parametrize(
    ("kind", "row", "reason"),
    [
        ("shared_state", "isolation", "keep per-episode state in setup_state"),
        ("random_tasks", "deterministic_tasks", "draw tasks from random.Random(seed)"),
        ("blind_rubric", "rubric", "pays the honest wrong answer like the right one"),
    ],
)
def test_a_broken_basket_fails_strict_with_its_reason(capsys, kind, row, reason):
    SHARED.clear()
    assert main(check(kind, "--strict")) == 1
    out = " ".join(capsys.readouterr().out.split("│"))
    line = next(text for text in out.splitlines() if text.strip().startswith(row))
    assert "FAIL" in line, out
    assert reason in " ".join(out.split()), out
    assert main(check(kind)) == 0  # without --strict: the report only


def test_a_bundled_environment_passes_strict(capsys):
    assert main(["env", "check", "calculator", "--tasks", "2", "--no-train", "--strict"]) == 0
    assert "exploits resisted" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "function", "function": {"name": "a b"}}, "must match"),
        (
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
            "no description",
        ),  # fmt: skip
        (
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "description": "d",
                    "parameters": {"type": "object", "properties": {}, "required": ["x"]},
                },
            },
            "required names ['x']",
        ),  # fmt: skip
        ({"name": "f"}, "is not {'type': 'function'"),
    ],
)
def test_schema_problems_name_what_is_wrong(schema, problem):
    assert problem in " ".join(schema_problems(schema))


class TwoToolsOneName(SingleTurnEnv):
    """Offers two schemas with one name (a ToolEnv refuses that; a hand-written env may not)."""

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The same `put` schema twice."""
        schema = {"type": "function", "function": {"name": "put", "description": "Put.",
                  "parameters": {"type": "object", "properties": {}}}}  # fmt: skip
        return [schema, schema]


async def test_two_tools_with_one_name_fail():
    env = TwoToolsOneName(name="twice", rubric=Rubric([correct]), eval_tasks=make_tasks)
    outcome = await check_tool_schemas(CheckContext(env, "twice", {}, tokenizer=None))
    assert outcome == Outcome("FAIL", "two tools are named 'put': rename one")


def test_bad_tasks_count_is_one_line(capsys):
    assert main(["env", "check", "calculator", "--tasks", "0"]) == 2
    assert "give at least 1 task" in capsys.readouterr().err


BUNDLED = {
    "calculator": [], "calculator_text": [], "search_qa": [], "wordle": [], "reasoning_gym": [],
    "python_math": [], "number_final": [], "support_desk": [], "mixture": ["--env.envs", '["calculator", "wordle"]'],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_every_bundled_environment_passes_strict(capsys, name):
    # the train smoke (10-45 s an environment) runs once, below; every other check runs here
    assert main(["env", "check", name, *BUNDLED[name], "--no-train", "--strict"]) == 0
    assert "failed" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_bundled_environment_passes_strict_with_the_train_smoke(capsys):
    assert main(["env", "check", "calculator", "--strict"]) == 0
    assert "2 steps on the tiny model" in capsys.readouterr().out


def test_the_gameable_environment_fails_strict_on_the_probe(capsys):
    assert main(["env", "check", "number_anywhere", "--tasks", "2", "--no-train", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "exploitable: candidate_list" in out and "failed: probe" in out
