"""Mixtures: weighted tasks tagged by environment, per-task dispatch, scoring and summaries."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import pytest
from helpers import check_token_invariants, run_episode

from looprl.engines.base import GenerationRequest
from looprl.engines.scripted import ScriptedEngine
from looprl.envs import calculator, reasoning_gym_env, wordle
from looprl.envs.base import SingleTurnEnv
from looprl.envs.mixture import MixtureEnv, _allocate, load_environment, per_env_summary
from looprl.rendering.parser import ParsedTurn
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import rollout, run_groups
from looprl.rubrics import Rubric
from looprl.types import EpisodeResult, Message, Task


@pytest.fixture(scope="module")
def mix() -> MixtureEnv:
    members = {
        "calc": calculator.load_environment(),
        "wordle": wordle.load_environment(),
        "arith": reasoning_gym_env.load_environment("basic_arithmetic", size=100),
    }
    return MixtureEnv(members, weights=[2, 1, 1])


def test_allocation_by_weight():
    assert _allocate(10, [2, 1, 1]) == [5, 3, 2]
    assert _allocate(7, [1, 0, 1]) == [4, 0, 3]
    assert sum(_allocate(101, [0.3, 0.3, 0.4])) == 101


def test_get_tasks_tags_and_interleaves(mix):
    tasks = mix.get_tasks("eval", 10, seed=1)
    assert [t.env for t in tasks[:3]] == ["calc", "wordle", "arith"]
    assert sorted(t.env for t in tasks) == ["arith"] * 2 + ["calc"] * 5 + ["wordle"] * 3
    assert all(mix.for_task(t) is mix.envs[t.env] for t in tasks)
    assert [t.id for t in tasks] == [t.id for t in mix.get_tasks("eval", 10, seed=1)]
    with pytest.raises(ValueError, match="env='calculator', which is not a member"):
        mix.for_task(calculator.load_environment().get_tasks("eval", 1)[0])


def _list_env(name: str, n: int) -> SingleTurnEnv:
    tasks = [
        Task(id=f"{name}-{i}", prompt=[Message(role="user", content=str(i))]) for i in range(n)
    ]
    return SingleTurnEnv(name=name, rubric=Rubric([]), train_tasks=tasks)


def test_train_stream_follows_weights_and_resumes_exactly():
    mix = MixtureEnv([_list_env("a", 30), _list_env("b", 7), _list_env("c", 5)], weights=[2, 1, 1])
    stream = list(itertools.islice(mix.iter_train_tasks(seed=7), 400))
    share = sum(t.env == "a" for t in stream) / len(stream)
    assert 0.42 < share < 0.58  # weight 2 of 4
    assert {t.id for t in stream if t.env == "b"} == {f"b-{i}" for i in range(7)}  # members cycle
    resumed = list(itertools.islice(mix.iter_train_tasks(seed=7, start=150), 50))
    assert [t.id for t in resumed] == [t.id for t in stream[150:200]]
    assert [t.id for t in stream] != [
        t.id for t in itertools.islice(mix.iter_train_tasks(seed=8), 400)
    ]


def test_fallback_properties(mix):
    assert [s["function"]["name"] for s in mix.tool_schemas] == ["calculate"]
    assert mix.limits.max_turns == 6 and mix.limits.max_tokens_per_turn == 256
    assert mix.rubric.names[:2] == ["correct_answer", "answer_format"] and "win" in mix.rubric.names


def test_construction_errors():
    calc = calculator.load_environment()
    with pytest.raises(ValueError, match="distinct names"):
        MixtureEnv([calc, calculator.load_environment()])
    with pytest.raises(ValueError, match="one each"):
        MixtureEnv([calc], weights=[1, 2])
    with pytest.raises(ValueError, match="not all 0"):
        MixtureEnv([calc], weights=[0])
    with pytest.raises(ValueError, match="unknown environments"):
        MixtureEnv([calc], weights={"wordle": 1})
    with pytest.raises(TypeError, match="not a looprl Environment"):
        MixtureEnv({"x": object()})  # type: ignore[dict-item]


def _player(tasks: list[Task]) -> Callable[[GenerationRequest], str]:
    """A scripted policy that solves each member's task: tool use, a guess, or the known answer."""
    answers = {t.prompt[-1].content: t.answer for t in tasks}

    def reply(request: GenerationRequest) -> str:
        system, user = request.messages[0].content, request.messages[1].content
        if "Wordle" in system:
            return "<guess>crane</guess>"
        if "calculate" not in system:
            return f"<answer>{answers[user]}</answer>"
        if request.messages[-1].role == "tool":
            return f"The answer is {request.messages[-1].content}."
        call = {
            "name": "calculate",
            "arguments": {"expression": user.removeprefix("What is ").removesuffix("?")},
        }
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    return reply


async def test_run_groups_score_each_task_with_its_own_rubric(mix):
    tasks = mix.get_tasks("eval", 4, seed=0)
    wordle_task = next(t for t in tasks if t.env == "wordle")
    wordle_task.answer = "crane"  # the scripted player always guesses crane
    groups = await run_groups(
        mix, ScriptedEngine(_player(tasks)), [(t, [0, 1]) for t in tasks], renderer=None
    )
    for group in groups:
        for ep in group:
            assert not ep.errors and ep.reward > 0.99, (ep.task.env, ep.rewards, ep.messages)
            assert set(ep.rewards) == set(mix.envs[ep.task.env].rubric.names)
    summary = per_env_summary([ep for g in groups for ep in g])
    assert set(summary) == {"calc", "wordle", "arith"}
    assert summary["calc"]["episodes"] == 4 and summary["calc"]["rewards"]["used_tool"] == 1.0
    assert summary["wordle"]["reward"] == pytest.approx(1.4)


async def test_token_level_uses_each_members_tools(mix, tiny_tokenizer):
    """The renderer built for the mixture offers `calculate`; a wordle episode must not see it."""
    for env_name in ("wordle", "calc"):
        task = next(t for t in mix.get_tasks("eval", 6) if t.env == env_name)
        engine = ScriptedEngine(_player([task]), tiny_tokenizer, logprob=-0.5)
        ep = await rollout(mix, engine, task, renderer=Renderer(tiny_tokenizer, mix.tool_schemas))
        await mix.for_task(task).rubric.score(ep)
        check_token_invariants(ep, mix, tiny_tokenizer)
        assert ("calculate" in tiny_tokenizer.decode(ep.trajectories[0].token_ids)) == (
            env_name == "calc"
        )


async def test_mixture_hooks_and_rubric_dispatch(mix):
    task = next(t for t in mix.get_tasks("eval", 4) if t.env == "wordle")
    state = await mix.setup_state(task)
    assert state["mixture_env"] == "wordle" and state["target"] == task.answer
    msgs = [
        *task.prompt,
        Message(role="assistant", content="<guess>zzzzz</guess>", raw="<guess>zzzzz</guess>"),
    ]
    outcome = await mix.step(msgs, ParsedTurn(content=msgs[-1].content), state)
    assert "not in the word list" in outcome.messages[0].content
    await mix.cleanup_state(state)
    await mix.cleanup_state({})  # setup never ran: nothing to do
    ep = await run_episode(mix, task, ["<guess>zzzzz</guess>"] * 6)
    mixed = [
        ep,
        EpisodeResult(
            task=Task(id="c", prompt=[], answer="4", env="calc"),
            messages=[Message(role="assistant", content="The answer is 4.")],
        ),
    ]
    await mix.rubric.score_group(mixed)
    assert mixed[0].rewards["invalid_guesses"] == 6 and mixed[1].rewards["correct_answer"] == 1.0


def test_per_env_summary_on_hand_made_episodes():
    def ep(env: str, reward: float, errors: list | None = None) -> EpisodeResult:
        return EpisodeResult(
            task=Task(id=env, prompt=[], env=env),
            reward=reward,
            rewards={"r": reward},
            errors=errors or [],
        )

    rows = per_env_summary(
        [ep("a", 1.0), ep("a", 0.0), ep("b", 0.5), ep("b", 9.0, [{"kind": "rollout"}])]
    )
    assert rows == {
        "a": {"episodes": 2, "errors": 0, "reward": 0.5, "rewards": {"r": 0.5}},
        "b": {"episodes": 2, "errors": 1, "reward": 0.5, "rewards": {"r": 0.5}},
    }
    assert per_env_summary([ep("c", 0.0, [{"kind": "scoring"}])]) == {
        "c": {"episodes": 1, "errors": 1}
    }


def test_registry_mixture():
    env = load_environment(
        ["wordle", {"env": "reasoning_gym", "dataset": "leg_counting", "size": 20}], weights=[1, 3]
    )
    assert set(env.envs) == {"wordle", "reasoning_gym.leg_counting"}
    assert sorted(t.env for t in env.get_tasks("eval", 4)) == ["reasoning_gym.leg_counting"] * 3 + [
        "wordle"
    ]
    with pytest.raises(ValueError, match="needs an 'env' key"):
        load_environment([{"dataset": "x"}])
