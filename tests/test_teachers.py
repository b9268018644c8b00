"""Tier 2: the scripted teachers win their environments as policies and write SFT rows that encode."""

from __future__ import annotations

import asyncio
import json

import pytest

from looprl.engines.scripted import ScriptedEngine
from looprl.envs.python_math import generate_tasks
from looprl.envs.registry import load_environment
from looprl.rendering import Renderer
from looprl.rollout.loop import run_group
from looprl.sft import teachers
from looprl.sft.teachers import main, make_teacher, python_math_code, sft_rows, teacher_episodes
from looprl.sft.train import examples_from_rows
from looprl.types import Message

CASES = [
    ("calculator", {}),
    ("search_qa", {}),
    ("wordle", {}),
    ("python_math", {}),
    ("reasoning_gym", {"dataset": "basic_arithmetic", "size": 200}),
    ("support_desk", {}),
]
POLICY_CASES = [
    ("calculator", {}, "calculator"),
    ("search_qa", {}, "search_qa"),
    ("wordle", {}, "wordle"),
    ("python_math", {}, "python_math"),
    ("reasoning_gym", {"dataset": "basic_arithmetic", "size": 200}, "basic_arithmetic"),
    ("support_desk", {}, "support_desk"),
]


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_teacher_solves_training_tasks_and_rows_encode(name, kwargs, tiny_tokenizer):
    env = load_environment(name, **kwargs)
    tasks = env.get_tasks("train", 12, seed=1)
    episodes = asyncio.run(teacher_episodes(env, make_teacher(name, env, kwargs), tasks))
    assert not any(ep.errors for ep in episodes)
    wins = [ep.reward or 0.0 for ep in episodes]
    # wordle's solver may lose a game; every other teacher is exact
    assert sum(r >= 1.0 for r in wins) >= (10 if name == "wordle" else 12), wins
    rows = sft_rows(env, episodes, min_reward=0.99)
    assert len(rows) == sum(r > 0.99 for r in wins)
    for row, ep in zip(rows, [ep for ep in episodes if (ep.reward or 0) > 0.99], strict=True):
        assert [Message.from_dict(m).content for m in row["messages"]] == [
            m.content for m in ep.messages
        ]
    examples = examples_from_rows(lambda tools: Renderer(tiny_tokenizer, tools), rows, "<|im_end|>")
    assert all(sum(ex.mask) > 0 for ex in examples)


@pytest.mark.parametrize(
    ("name", "kwargs", "policy"), POLICY_CASES, ids=[c[2] for c in POLICY_CASES]
)
def test_policy_reads_only_messages_and_wins_eval_tasks(name, kwargs, policy):
    """Each POLICIES name is a plain fn(messages) -> str that wins held-out tasks it never saw."""
    assert policy in teachers.POLICIES
    fn = getattr(teachers, policy)
    env = load_environment(name, **kwargs)
    tasks = env.get_tasks("eval", 8, seed=3)

    async def play(task):
        engine = ScriptedEngine(lambda request: fn(list(request.messages)))
        return (await run_group(env, engine, task, 1, renderer=None))[0]

    episodes = [asyncio.run(play(t)) for t in tasks]
    assert not any(ep.errors for ep in episodes)
    assert sum((ep.reward or 0.0) >= 1.0 for ep in episodes) >= (7 if name == "wordle" else 8)


def test_policies_cover_the_module_table():
    doc = teachers.__doc__ or ""
    assert all(f"| `{name}` |" in doc for name in teachers.POLICIES)
    assert all(callable(getattr(teachers, name)) for name in teachers.POLICIES)


def test_policies_answer_unknown_questions_without_raising():
    odd = [Message(role="user", content="What is the meaning of life")]
    replies = [getattr(teachers, name)(odd) for name in teachers.POLICIES]
    assert replies[0] == "I cannot read this question."
    assert "<answer>unknown</answer>" in replies  # search_qa and basic_arithmetic
    assert teachers.wordle(odd) == "<guess>slate</guess>"


def test_teacher_tool_results_are_the_real_tools():
    env = load_environment("search_qa")
    [task] = [t for t in env.get_tasks("train", 20, seed=0) if t.info["hops"] == 2][:1]
    for teacher in (make_teacher("search_qa", env, {}), lambda t: teachers.search_qa):
        [ep] = asyncio.run(teacher_episodes(env, teacher, [task]))
        tools = [m for m in ep.messages if m.role == "tool"]
        assert [m.name for m in tools] == ["search", "read", "search", "read"]
        gold = task.info["gold_doc_ids"]
        assert f"[{gold[0]}]" in tools[0].content  # the title search finds the gold page
        assert ep.rewards["gold_read"] == 1.0 and ep.reward == 1.0


def test_python_math_code_covers_every_template():
    tasks = generate_tasks("train", 60, seed=0)
    assert all(python_math_code(t.prompt[-1].content) for t in tasks)
    assert python_math_code("What is the meaning of life?") is None


def test_cli_writes_rows_and_refuses_unknown_env(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert main(["python_math", "--n", "3", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and rows[0]["tools"][0]["function"]["name"] == "python_session"
    assert "kept 3" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no teacher for environment 'dates'"):
        make_teacher("dates", load_environment("calculator"), {})
    with pytest.raises(SystemExit, match="--env.KEY VALUE"):
        main(["python_math", "--out", str(out), "--bogus", "1"])
