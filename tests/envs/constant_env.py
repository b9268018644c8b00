"""A test environment whose reward is the same for every reply: every group is uniform."""

from __future__ import annotations

from looprl import EpisodeResult, Limits, Message, Rubric, SingleTurnEnv, Task


def constant(episode: EpisodeResult) -> float:
    """0.0 whatever the reply: no rollout does better than another."""
    return 0.0


def load_environment(**kwargs) -> SingleTurnEnv:
    """Single-turn prompts 'Say something #i'; reward 0 for every reply."""

    def tasks(n: int, seed: int) -> list[Task]:
        return [
            Task(id=f"c{seed}-{i}", prompt=[Message(role="user", content=f"Say something #{i}")])
            for i in range(n)
        ]

    return SingleTurnEnv(
        name="constant", rubric=Rubric([constant]), train_tasks=tasks, eval_tasks=tasks,
        limits=Limits(max_turns=1, max_tokens_per_turn=8),
    )  # fmt: skip
