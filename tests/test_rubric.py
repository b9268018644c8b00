"""Tier 1: rubric weights, metrics, group functions, async functions and scoring errors."""

from __future__ import annotations

import pytest

from looprl.rubrics import Rubric
from looprl.types import EpisodeResult, Message, Task


def _ep(answer: str, reply: str) -> EpisodeResult:
    task = Task(id="t", prompt=[Message(role="user", content="q")], answer=answer)
    return EpisodeResult(
        task=task, messages=[*task.prompt, Message(role="assistant", content=reply)]
    )


def correct(ep: EpisodeResult) -> float:
    return float(ep.messages[-1].content == ep.task.answer)


async def length(ep: EpisodeResult) -> float:
    return float(len(ep.messages[-1].content))


def rank(eps: list[EpisodeResult]) -> list[float]:
    order = sorted(range(len(eps)), key=lambda i: len(eps[i].messages[-1].content))
    out = [0.0] * len(eps)
    for r, i in enumerate(order):
        out[i] = r / max(1, len(eps) - 1)
    return out


async def test_weighted_sum_metrics_and_group():
    rubric = Rubric([correct, length], weights=[2.0, 0.0], group_funcs=[rank], group_weights=[0.5])
    eps = [_ep("4", "4"), _ep("4", "five")]
    await rubric.score_group(eps)
    assert eps[0].rewards == {"correct": 1.0, "length": 1.0, "rank": 0.0}
    assert eps[0].reward == pytest.approx(2.0)
    assert eps[1].reward == pytest.approx(0.5)  # metric weight 0 contributes nothing
    assert rubric.names == ["correct", "length", "rank"]


async def test_raising_reward_is_a_scoring_error_not_zero():
    def broken(ep: EpisodeResult) -> float:
        raise KeyError("missing field")

    rubric = Rubric([correct, broken])
    ep = _ep("4", "4")
    await rubric.score(ep)
    assert "broken" not in ep.rewards
    assert ep.scoring_error and not ep.trainable
    assert ep.errors[0]["function"] == "broken" and "missing field" in ep.errors[0]["message"]


async def test_non_numeric_and_nan_rewards_are_errors():
    def text(ep: EpisodeResult) -> float:
        return "yes"  # type: ignore[return-value]

    def nan(ep: EpisodeResult) -> float:
        return float("nan")

    rubric = Rubric([text, nan])
    ep = _ep("4", "4")
    await rubric.score(ep)
    messages = " ".join(e["message"] for e in ep.errors)
    assert "expected a float" in messages and "finite" in messages


async def test_group_function_with_wrong_length_errors_every_episode():
    rubric = Rubric(group_funcs=[lambda eps: [1.0]])
    eps = [_ep("1", "1"), _ep("1", "2")]
    await rubric.score_group(eps)
    assert all(ep.scoring_error for ep in eps)


def test_bad_weights_and_duplicate_names():
    with pytest.raises(ValueError, match="one weight per function"):
        Rubric([correct], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="unique"):
        Rubric([correct, correct])


async def test_rewards_beyond_the_float32_safe_bound_are_errors():
    # 1e39 is a finite Python float but inf in float32 advantages: it must not reach them
    def huge(ep: EpisodeResult) -> float:
        return 1e39

    def very_negative(eps: list[EpisodeResult]) -> list[float]:
        return [-2e6] * len(eps)

    rubric = Rubric([huge], group_funcs=[very_negative])
    ep = _ep("4", "4")
    await rubric.score(ep)
    assert ep.scoring_error and not ep.trainable and ep.rewards == {}
    assert [e["function"] for e in ep.errors] == ["huge", "very_negative"]
    assert all("beyond the bound" in e["message"] for e in ep.errors)


async def test_a_reward_at_the_bound_is_kept():
    def at_bound(ep: EpisodeResult) -> float:
        return -1e6

    rubric = Rubric([at_bound])
    ep = _ep("4", "4")
    await rubric.score(ep)
    assert not ep.errors and ep.reward == -1e6
