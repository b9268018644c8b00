"""The curriculum that follows the pass rate and the hints that fade (looprl.trainer.curriculum).

Tier 1: the band controller's rules with hand-computed numbers. Tier 2: a scripted policy on
the calculator that passes up to a known level drives the sampler through real rollouts; a
hinted tool call is never credited to the model. Tier 3 (slow): a tiny-model run resumed from
its checkpoint continues the curriculum exactly, and its evaluation has no hint.
"""

from __future__ import annotations

import json

import pytest

from looprl import Task, model_messages, tool_calls, used_tool
from looprl.engines.base import GenerationRequest
from looprl.engines.scripted import ScriptedEngine
from looprl.envs.arithmetic import safe_eval
from looprl.envs.calculator import load_environment as calculator
from looprl.envs.hints import is_hinted
from looprl.envs.search_qa import gold_read
from looprl.envs.search_qa import load_environment as search_qa
from looprl.envs.wordle import load_environment as wordle
from looprl.rollout.loop import RolloutConfig, run_groups
from looprl.trainer.config import ConfigError, load_config
from looprl.trainer.curriculum.controller import (
    Band,
    hint_probability,
    next_level,
    running_rate,
)
from looprl.trainer.curriculum.sampler import Curriculum, TaskSampler, task_sampler
from looprl.trainer.metrics import declared
from looprl.types import EpisodeResult
from tests.helpers import read_metrics, run_episode, small_config, stable

BAND = Band(low=0.2, high=0.8, ema=0.5, min_groups=4)


# -- tier 1: the controller --------------------------------------------------------------------


def test_running_rate_starts_at_the_first_batch_then_averages() -> None:
    assert running_rate(None, 0.25, 0.5) == 0.25
    assert running_rate(0.25, 1.0, 0.5) == 0.625  # 0.5 * 0.25 + 0.5 * 1.0
    assert running_rate(0.625, 0.0, 1.0) == 0.0  # weight 1: the newest batch alone


def test_the_band_moves_up_above_high_down_below_low_and_waits_for_min_groups() -> None:
    assert next_level(1, 0.9, seen=4, band=BAND, levels=3) == 2  # 0.9 > 0.8: up
    assert next_level(1, 0.1, seen=4, band=BAND, levels=3) == 0  # 0.1 < 0.2: down
    assert next_level(1, 0.5, seen=4, band=BAND, levels=3) == 1  # in the band: stay
    assert next_level(1, 0.9, seen=3, band=BAND, levels=3) == 1  # 3 groups < min_groups 4
    assert next_level(1, None, seen=9, band=BAND, levels=3) == 1  # no pass rate yet
    assert next_level(2, 1.0, seen=9, band=BAND, levels=3) == 2  # the top stays the top
    assert next_level(0, 0.0, seen=9, band=BAND, levels=3) == 0  # the bottom stays the bottom


def test_hint_probability_falls_linearly_with_the_pass_rate() -> None:
    assert hint_probability(None, 0.5) == 1.0  # no pass rate yet: always
    assert hint_probability(0.0, 0.5) == 1.0
    assert hint_probability(0.25, 0.5) == 0.5  # (0.5 - 0.25) / 0.5
    assert hint_probability(0.5, 0.5) == 0.0
    assert hint_probability(0.9, 0.5) == 0.0  # clamped at 0


def test_a_band_that_is_not_a_band_is_refused_naming_both_fields() -> None:
    with pytest.raises(ConfigError, match=r"curriculum.target_low \(0.8\) must be below"):
        load_config(None, {"curriculum.target_low": 0.8, "curriculum.target_high": 0.5})


def test_tasks_of_one_difficulty_are_refused_with_the_fix() -> None:
    cfg = load_config(None, {"curriculum.enabled": True})
    with pytest.raises(ConfigError, match=r"difficulty 3; it needs two or more \(calculator: env"):
        task_sampler(cfg, calculator())  # the calculator's default: 3-digit operands only


def test_a_task_without_a_numeric_difficulty_is_refused_with_the_fix() -> None:
    env = calculator(digits=[1, 2])
    env.train_tasks = [Task("t1", [], info={"difficulty": "easy"})]
    cfg = load_config(None, {"curriculum.enabled": True})
    with pytest.raises(ConfigError, match=r"'t1' has info\['difficulty'\] = 'easy', not a num"):
        task_sampler(cfg, env)


# -- tier 2: a scripted policy drives the sampler ----------------------------------------------


def policy_up_to(level: int):
    """A scripted calculator policy: right on operands of fewer than `level` digits, right on
    about half of those of `level` digits (by the turn's sampling seed), wrong above; answers
    from a hinted call's result whenever the prompt holds one."""

    def reply(request: GenerationRequest) -> str:
        if request.messages[-1].role == "tool":
            return f"The answer is {request.messages[-1].content}."
        expr = request.messages[-1].content.removeprefix("What is ").rstrip("?")
        size = max(len(x) for x in expr.split() if x.isdigit())
        right = size < level or (size == level and (request.sampling.seed or 0) % 2 == 0)
        return f"The answer is {safe_eval(expr) + (0 if right else 1)}."

    return reply


async def run_steps(sampler: TaskSampler, env, engine, steps: int) -> list[float]:
    """`steps` batches of 8 groups of 4: drawn, rolled out, scored, observed; each step's level."""
    levels = []
    for step in range(1, steps + 1):
        tasks = sampler.draw(0, 8)
        groups = await run_groups(
            env, engine, [(t, [0, 1, 2, 3]) for t in tasks], renderer=None,
            config=RolloutConfig(seed=step),
        )  # fmt: skip
        sampler.observe(step, groups)
        levels.append(sampler.metrics(step)["curriculum/level"])
    return levels


def curriculum_config(**overrides):
    base = {"curriculum.enabled": True, "curriculum.min_groups": 8}
    return load_config(None, {**base, **overrides})


async def test_the_curriculum_settles_at_the_level_the_policy_half_passes() -> None:
    env = calculator(digits=[1, 2, 3, 4])
    engine = ScriptedEngine(policy_up_to(3))
    sampler = task_sampler(curriculum_config(), env)
    assert isinstance(sampler, Curriculum) and sampler.levels == [1, 2, 3, 4]
    levels = await run_steps(sampler, env, engine, 8)
    # 1 and 2 digits always pass (> 0.8: up after one step each); 3 digits pass about half
    assert levels[:2] == [1.0, 2.0] and levels[2:] == [3.0] * 6
    again = await run_steps(task_sampler(curriculum_config(), env), env, engine, 8)
    assert again == levels  # the same seed: the same tasks, levels and moves


async def test_a_level_that_collapses_sends_the_curriculum_down() -> None:
    env = calculator(digits=[1, 2, 3])
    sampler = task_sampler(curriculum_config(**{"curriculum.start_level": 2}), env)
    assert isinstance(sampler, Curriculum)
    levels = await run_steps(sampler, env, ScriptedEngine(policy_up_to(2)), 4)
    assert levels[0] == 3.0 and levels[1] == 2.0  # 3 digits never pass (< 0.2): down to 2


def fake_groups(tasks: list[Task], passed: int, size: int = 4) -> list[list[EpisodeResult]]:
    """A group per task in which `passed` of `size` episodes reached reward 1."""
    return [[EpisodeResult(task=t, reward=float(i < passed)) for i in range(size)] for t in tasks]


def test_the_hint_rate_falls_as_the_pass_rate_rises() -> None:
    cfg = load_config(None, {"hints.enabled": True, "curriculum.ema": 1.0})
    sampler = task_sampler(cfg, calculator())
    assert isinstance(sampler, Curriculum) and sampler.levels == [None]
    rates = []
    for step, passed in enumerate([0, 1, 2, 3], start=1):  # pass rates 0, 0.25, 0.5, 0.75
        tasks = sampler.draw(0, 200)
        rates.append(sum(map(is_hinted, tasks)) / len(tasks))
        sampler.observe(step, fake_groups(tasks, passed))
        assert sampler.metrics(step)["curriculum/hint_rate"] == rates[-1]
    tasks = sampler.draw(0, 200)
    rates.append(sum(map(is_hinted, tasks)) / len(tasks))
    # before any pass rate: always; then probabilities 1, 0.5, 0, 0 (target 0.5)
    assert rates[0] == rates[1] == 1.0
    assert 0.4 < rates[2] < 0.6 and rates[3] == rates[4] == 0.0


def test_the_sampler_state_continues_exactly_after_a_json_round_trip() -> None:
    cfg = curriculum_config(**{"curriculum.min_groups": 4, "hints.enabled": True})
    env = calculator(digits=[1, 2, 3])
    first = task_sampler(cfg, env)
    for step, passed in enumerate([4, 4, 2], start=1):
        first.observe(step, fake_groups(first.draw(0, 4), passed))
    saved = json.loads(json.dumps(first.state()))
    second = task_sampler(cfg, env)
    second.load_state(saved)
    for step, passed in enumerate([1, 3], start=4):
        a, b = first.draw(0, 4), second.draw(0, 4)
        assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
        first.observe(step, fake_groups(a, passed))
        second.observe(step, fake_groups(b, passed))
        assert first.metrics(step) == second.metrics(step)
    state = first.state()
    assert state == second.state() and state is not None and state["level"] == 2


# -- the rubric credits only what the model did ------------------------------------------------


def hinted(env, task: Task) -> Task:
    """`task` as the sampler hands it out when it hints (hint probability 1)."""
    sampler = task_sampler(load_config(None, {"hints.enabled": True}), env)
    assert isinstance(sampler, Curriculum)
    sampler.env.train_tasks = [task]
    (out,) = sampler.draw(0, 1)
    assert is_hinted(out)
    return out


async def test_a_hinted_tool_call_is_not_the_models_call(tiny_tokenizer) -> None:
    env = calculator()
    task = hinted(env, env.get_tasks("train", 1)[0])
    result = task.prompt[-1].content  # the hinted call's result, in the prompt
    answer = f"The answer is {result}."  # a list script would count the hinted assistant turn
    ep = await run_episode(env, task, lambda request: answer, tiny_tokenizer)
    assert ep.reward == 1.0  # the answer is the model's own, and it is right
    assert ep.rewards["used_tool"] == 0.0 and used_tool(ep) == 0.0  # the call was not its own
    assert tool_calls(ep) == [] and ep.num_tool_calls == 0
    assert [m.role for m in model_messages(ep)] == ["assistant"]
    trained = "".join(
        tiny_tokenizer.decode([t for t, m in zip(tr.token_ids, tr.mask, strict=True) if m])
        for tr in ep.trajectories
    )
    assert result in tiny_tokenizer.decode(ep.trajectories[0].token_ids)  # in the context
    assert "calculate" not in trained  # the hinted call is prompt (mask 0), never trained on


async def test_a_hinted_first_hop_is_not_credited_as_a_gold_page_read() -> None:
    env = search_qa()
    two_hop = next(t for t in env.get_tasks("train") if t.info["hops"] == 2)
    task = hinted(env, two_hop)
    ep = await run_episode(env, task, lambda request: f"<answer>{task.answer}</answer>")
    assert task.prompt[-2].tool_calls[0].name == "read"  # the first page, read for it
    assert ep.reward == 1.0 and gold_read(ep) == 0.0 and ep.rewards["searches"] == 0.0


def test_a_calculator_note_hint_names_the_call_and_leaves_it_to_the_model() -> None:
    env = calculator(hint_style="note")
    task = hinted(env, env.get_tasks("train", 1)[0])
    assert task.prompt[-1].role == "user" and task.info["expression"] in task.prompt[-1].content
    with pytest.raises(
        ValueError, match=r"hint_style='made': choose one of \['answer', 'call', 'note'\]"
    ):
        calculator(hint_style="made")


def test_a_wordle_hint_names_eight_words_the_secret_among_them() -> None:
    env = wordle()
    task = hinted(env, env.get_tasks("train", 1)[0])
    note = task.prompt[-1]
    words = note.content.removeprefix("The secret word is one of: ").rstrip(".").split(", ")
    assert note.role == "user" and len(set(words)) == 8 and task.answer in words


# -- tier 3: a tiny-model run ------------------------------------------------------------------


@pytest.mark.slow
def test_a_resumed_run_continues_the_curriculum_and_evaluation_has_no_hint(
    tmp_path, monkeypatch
) -> None:
    from looprl.trainer.trainer import Trainer

    overrides = {
        "env.name": "calculator", "env.kwargs": {"digits": [1, 2], "max_turns": 2},
        "rollout.max_tokens": 12, "trainer.steps": 4, "trainer.save_every": 2,
        "trainer.eval_every": 4, "curriculum.enabled": True, "curriculum.min_groups": 2,
        "hints.enabled": True, "hints.target": 1.0,
    }  # fmt: skip
    Trainer(small_config(tmp_path, "full", **overrides)).run()
    full = read_metrics(tmp_path / "full")
    assert all(r["curriculum/hint_rate"] == 1.0 for r in full)  # nothing passes: always hinted
    assert [r["curriculum/groups/1"] for r in full] == [2.0, 4.0, 6.0, 8.0]
    assert all(declared(k) for r in full for k in r)  # docs/metrics.md lists every key
    episodes = (tmp_path / "full" / "rollouts" / "step_000001.jsonl").read_text().splitlines()
    assert all(json.loads(line)["task"]["info"]["hint"] == "tool_call" for line in episodes)
    results = (tmp_path / "full" / "eval" / "step_000004" / "results.jsonl").read_text()
    evaluated = [json.loads(line) for line in results.splitlines()]
    assert evaluated and not any("hint" in r["task"]["info"] for r in evaluated)

    original = Trainer._save_rollouts

    def crash_at_step_3(self, step, groups):
        original(self, step, groups)
        if step == 3:
            raise KeyboardInterrupt("killed after step 3 was logged, before its checkpoint")

    crash = small_config(tmp_path, "crash", **overrides)
    monkeypatch.setattr(Trainer, "_save_rollouts", crash_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        Trainer(crash).run()
    monkeypatch.setattr(Trainer, "_save_rollouts", original)
    Trainer(crash, resume=True).run()
    assert [stable(r) for r in read_metrics(tmp_path / "crash")] == [stable(r) for r in full]
