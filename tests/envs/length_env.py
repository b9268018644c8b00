"""A test environment whose reward varies between samples of a random model (reply length)."""

from __future__ import annotations

from looprl import EpisodeResult, Limits, Message, Rubric, SingleTurnEnv, Task


def reply_length(episode: EpisodeResult) -> float:
    """Characters in the final reply, scaled to about [0, 1]."""
    return min(len(episode.messages[-1].content), 100) / 100


def load_environment(**kwargs) -> SingleTurnEnv:
    """Single-turn prompts 'Say something #i'; reward = reply length."""

    def tasks(n: int, seed: int) -> list[Task]:
        return [
            Task(id=f"s{seed}-{i}", prompt=[Message(role="user", content=f"Say something #{i}")])
            for i in range(n)
        ]

    return SingleTurnEnv(
        name="length", rubric=Rubric([reply_length]), train_tasks=tasks, eval_tasks=tasks,
        limits=Limits(max_turns=1, max_tokens_per_turn=kwargs.get("max_tokens_per_turn", 12)),
    )  # fmt: skip
