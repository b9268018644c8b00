"""Tier 1: the calculator's safe evaluator, task splits and reward functions."""

from __future__ import annotations

import pytest

from looprl import EpisodeResult, Message, Task, tool_call_validity, used_tool
from looprl.envs.calculator import (
    answer_format,
    calculate,
    correct_answer,
    extract_answer,
    generate_tasks,
    load_environment,
    safe_eval,
)


def test_safe_eval_arithmetic():
    assert safe_eval("(12 + 3) * 4") == 60
    assert safe_eval("-7 // 2") == -4
    assert calculate("10 / 4") == "2.5" and calculate("8 / 4") == "2"


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('ls')",
        "open('/etc/passwd')",
        "2 ** 1000",
        "[1, 2]",
        "x + 1",
        "9" * 300,
        "1 +",
    ],
)
def test_safe_eval_rejects_code_and_huge_numbers(expr):
    with pytest.raises(ValueError):
        safe_eval(expr)


def test_splits_never_overlap_and_are_seeded():
    train = {t.info["expression"] for seed in range(3) for t in generate_tasks("train", 400, seed)}
    test = {t.info["expression"] for seed in range(3) for t in generate_tasks("eval", 400, seed)}
    assert not train & test
    assert [t.id for t in generate_tasks("eval", 20, 5)] == [
        t.id for t in generate_tasks("eval", 20, 5)
    ]
    assert [t.id for t in generate_tasks("eval", 20, 5)] != [
        t.id for t in generate_tasks("eval", 20, 6)
    ]
    for t in generate_tasks("train", 50, 0):
        assert str(safe_eval(t.info["expression"])) == t.answer


def test_extract_answer():
    assert extract_answer("The answer is 1,234.") == "1234"
    assert extract_answer("I think -56 maybe 78") == "78"
    assert extract_answer("no number") is None


def _ep(reply: str, *, calls: int = 0, errors: dict[str, int] | None = None) -> EpisodeResult:
    task = Task(id="t", prompt=[Message(role="user", content="What is 2 + 2?")], answer="4")
    return EpisodeResult(
        task=task, messages=[*task.prompt, Message(role="assistant", content=reply)],
        num_tool_calls=calls, tool_errors=errors or {},
    )  # fmt: skip


def test_rewards_on_hand_made_cases():
    assert correct_answer(_ep("The answer is 4.")) == 1.0
    assert correct_answer(_ep("The answer is 5.")) == 0.0
    assert correct_answer(_ep("")) == 0.0
    assert answer_format(_ep("It is 4")) == 0.0 and answer_format(_ep("The answer is 4.")) == 1.0
    assert used_tool(_ep("x", calls=1)) == 1.0
    assert used_tool(_ep("x", calls=1, errors={"malformed_json": 1})) == 0.0
    assert tool_call_validity(_ep("x", calls=2, errors={"unknown_tool": 1})) == 0.5
    assert tool_call_validity(_ep("x")) == 1.0


def test_environment_loads_with_tools_and_prompt():
    env = load_environment()
    assert [s["function"]["name"] for s in env.tool_schemas] == ["calculate"]
    task = env.get_tasks("eval", 1)[0]
    assert task.prompt[0].role == "system" and task.env == "calculator"
