"""calculator_text (the calculator without its tool), operand sizes, and benchmarks/tools_vs_text.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from looprl.envs.calculator import generate_tasks
from looprl.envs.calculator_text import worked_answer, worked_steps
from looprl.envs.registry import load_environment
from looprl.sft.teachers import teacher_episodes


def test_text_variant_has_the_calculators_tasks_and_no_tool():
    tools = load_environment("calculator", digits=[1, 2, 3])
    text = load_environment("calculator_text", digits=[1, 2, 3])
    a, b = tools.get_tasks("eval", 30, seed=4), text.get_tasks("eval", 30, seed=4)
    assert [(t.id, t.answer, t.info) for t in a] == [(t.id, t.answer, t.info) for t in b]
    assert {t.info["digits"] for t in b} == {1, 2, 3}
    assert text.tool_schemas == [] and text.limits.max_turns == 1
    assert "no tools" in b[0].prompt[0].content and b[0].env == "calculator_text"


def test_operand_sizes_match_the_recorded_digits():
    for task in generate_tasks("train", 60, 0, digits=[1, 2, 4]):
        operands = task.info["expression"].split()[::2]
        assert all(len(x) == task.info["digits"] for x in operands if x != "0"), task.info


def test_bad_digits_are_named():
    with pytest.raises(ValueError, match="digits=\\[0, 3\\]: give operand sizes from 1 to 6"):
        load_environment("calculator_text", digits=[0, 3])


def test_worked_steps_follow_precedence():
    assert worked_steps("2 - 8 * 2") == ["8 * 2 = 16", "2 - 16 = -14"]
    assert worked_steps("7 - 3 - 2") == ["7 - 3 = 4", "4 - 2 = 2"]  # left to right
    assert worked_steps("3 * 4 * 5") == ["3 * 4 = 12", "12 * 5 = 60"]


def test_the_text_teacher_solves_every_task_through_the_real_rollout():
    env = load_environment("calculator_text", digits=[1, 2, 3])
    tasks = env.get_tasks("train", 24, seed=0)
    episodes = asyncio.run(teacher_episodes(env, lambda task: worked_answer, tasks))
    assert [ep.reward for ep in episodes] == [1.0] * 24
    assert all(ep.num_tool_calls == 0 and ep.num_turns == 1 for ep in episodes)


@pytest.mark.slow
def test_tools_vs_text_smoke_then_everything_is_read_back(tmp_path):
    from benchmarks import tools_vs_text

    argv = [
        "--model", "tiny", "--steps", "1", "--eval-every", "1", "--warm-start", "4",
        "--eval-tasks", "6", "--tasks-per-step", "2", "--rollouts", "2", "--out", str(tmp_path),
    ]  # fmt: skip
    tools_vs_text.main(argv)
    first = json.loads((tmp_path / "summary.json").read_text())
    assert [r["status"] for r in first["runs"]] == ["ran", "ran"]
    sizes = [(r["variant"], r["digits"]) for r in first["per_size"]]
    assert ("tools", "all") in sizes and ("text", "all") in sizes
    assert sum(r["n"] for r in first["per_size"] if r["digits"] != "all") == 12
    assert (tmp_path / "text" / "sft" / "config.json").exists()
    tools_vs_text.main(argv)  # a rerun: the warm starts and the RL runs are read back
    second = json.loads((tmp_path / "summary.json").read_text())
    assert [r["status"] for r in second["runs"]] == ["reused", "reused"]
    assert second["per_size"] == first["per_size"]
