"""reasoning_gym adapter: several datasets, the package's own scoring, splits and token masks."""

from __future__ import annotations

import pytest
from helpers import check_token_invariants, run_episode

from looprl.envs.reasoning_gym_env import answer_format, extract_answer, load_environment
from looprl.envs.registry import load_environment as load_registered
from looprl.types import EpisodeResult, Message, Task

DATASETS = ["leg_counting", "basic_arithmetic", "spell_backward", "word_sorting"]


def test_extract_answer():
    assert extract_answer("think... <answer> 12 </answer>") == "12"
    assert extract_answer("<answer>1</answer> no, <answer>2</answer>") == "2"
    assert extract_answer("the answer is 12") is None


@pytest.mark.parametrize("dataset", DATASETS)
async def test_dataset_episodes_scored_by_the_package(dataset):
    env = load_environment(dataset, size=60, seed=3)
    assert env.name == f"reasoning_gym.{dataset}"
    task = env.get_tasks("eval", 1)[0]
    assert task.prompt[0].role == "system" and "<answer>" in task.prompt[0].content
    right = await run_episode(env, task, [f"Working it out.\n<answer>{task.answer}</answer>"])
    assert (
        right.reward == 1.0
        and right.rewards["answer_format"] == 1.0
        and right.stop_reason == "done"
    )
    wrong = await run_episode(env, task, ["<answer>certainly not this</answer>"])
    assert wrong.reward < 1.0 and not wrong.errors
    missing = await run_episode(env, task, [task.answer or ""])  # right text, but no tags
    assert missing.reward == 0.0 and missing.rewards["answer_format"] == 0.0


@pytest.mark.parametrize("dataset", DATASETS)
def test_splits_never_overlap_and_are_seeded(dataset):
    env = load_environment(dataset, size=200, seed=0)
    train = {t.prompt[-1].content for s in range(3) for t in env.get_tasks("train", 200, s)}
    test = {t.prompt[-1].content for s in range(3) for t in env.get_tasks("eval", 200, s)}
    assert train and test and not train & test
    assert [t.id for t in env.get_tasks("eval", 5, 1)] == [
        t.id for t in env.get_tasks("eval", 5, 1)
    ]
    first = env.get_tasks("train", 5, 0)
    assert len({t.id for t in first}) == 5
    assert [t.id for t in first] != [t.id for t in env.get_tasks("train", 5, 1)]


def test_dataset_kwargs_registry_and_errors():
    env = load_registered(
        "reasoning_gym", dataset="leg_counting", size=20, min_animals=2, max_animals=2
    )
    for task in env.get_tasks("train", 5):
        assert (
            task.prompt[-1].content.split(" you have ")[-1].count(",") == 1
        )  # two kinds of animal
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'no_such_set'"):
        load_environment("no_such_set")


def test_answer_format_metric():
    task = Task(id="t", prompt=[Message(role="user", content="q")], answer="4")
    ep = EpisodeResult(
        task=task, messages=[*task.prompt, Message(role="assistant", content="<answer>4</answer>")]
    )
    assert answer_format(ep) == 1.0


async def test_token_level_masks(tiny_tokenizer):
    env = load_environment("basic_arithmetic", size=30)
    task = env.get_tasks("eval", 1)[0]
    ep = await run_episode(env, task, [f"<answer>{task.answer}</answer>"], tiny_tokenizer)
    check_token_invariants(ep, env, tiny_tokenizer)
    assert ep.reward == 1.0


async def test_token_limit_truncates_the_answer(tiny_tokenizer):
    env = load_environment("basic_arithmetic", size=30, max_tokens_per_turn=8)
    task = env.get_tasks("eval", 1)[0]
    ep = await run_episode(
        env,
        task,
        [f"Let me think step by step first. <answer>{task.answer}</answer>"],
        tiny_tokenizer,
    )
    assert ep.truncated and ep.stop_reason == "max_tokens" and ep.num_generated_tokens == 8
    assert ep.reward == 0.0 and ep.rewards["answer_format"] == 0.0


def test_training_stream_cycles_a_finite_dataset():
    """A dataset smaller than a generator epoch trains: each epoch is the whole train split,
    reshuffled, and a resumed stream continues exactly."""
    import itertools

    env = load_environment("basic_arithmetic", size=60, min_terms=2, max_terms=2, max_digits=1)
    pool = {t.id for t in env.get_tasks("train", 1000, seed=0)}
    assert 0 < len(pool) < 60
    stream = [t.id for t in itertools.islice(env.iter_train_tasks(seed=3), 3 * len(pool))]
    epochs = [stream[i : i + len(pool)] for i in range(0, len(stream), len(pool))]
    assert all(set(e) == pool for e in epochs) and epochs[0] != epochs[1]
    resumed = [t.id for t in itertools.islice(env.iter_train_tasks(seed=3, start=len(pool) + 5), 9)]
    assert resumed == stream[len(pool) + 5 : len(pool) + 14]


def test_training_stream_refuses_a_generator_that_changes_size():
    from looprl.envs.base import SingleTurnEnv

    sizes = iter([5, 3])

    def shrinking(n: int, seed: int) -> list[Task]:
        return [
            Task(id=f"t{i}", prompt=[Message(role="user", content=str(i))])
            for i in range(next(sizes))
        ]

    env = SingleTurnEnv(name="shrinking", rubric=None, train_tasks=shrinking)
    stream = env.iter_train_tasks(seed=0)
    assert len([next(stream) for _ in range(5)]) == 5
    with pytest.raises(
        ValueError, match="generated 3 training tasks for epoch 1 but 5 for epoch 0"
    ):
        next(stream)


def test_the_answer_hint_is_opt_in_and_names_the_answer() -> None:
    import random

    plain = load_environment("basic_arithmetic", size=20)
    task = plain.get_tasks("train", 1)[0]
    assert plain.hint(task, random.Random(0)) is None  # no hint unless asked: RL would copy it
    env = load_registered("reasoning_gym", dataset="basic_arithmetic", size=20, hint_style="answer")
    hint = env.hint(task, random.Random(0))
    assert hint is not None and hint.kind == "note"
    assert f"<answer>{task.answer}</answer>" in (hint.messages[0].content or "")
    with pytest.raises(ValueError, match="hint_style='call'"):
        load_environment("basic_arithmetic", hint_style="call")
