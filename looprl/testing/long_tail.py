"""The calculator with a long tail: one episode in `every` waits `slow_s` seconds on each turn.

Multi-turn agent work has a few episodes far slower than the rest (a slow tool, a long tool
chain); this environment makes that tail exact, for the streaming tests and
`benchmarks/async_pipeline.py`. Tasks, tool and rubric are the calculator's
(`looprl.envs.calculator`), so held-out accuracy is the calculator's. The slow episodes are the
`every`-th, 2`every`-th, ... episode this environment starts, whatever their task.

    looprl train calculator_tiny.toml --env.name looprl.testing.long_tail --env.kwargs '{"every": 16}'
"""

from __future__ import annotations

import asyncio
from typing import Any

import looprl
from looprl.envs.arithmetic import calculate
from looprl.envs.calculator import SYSTEM_PROMPT, answer_format, correct_answer, generate_tasks
from looprl.rendering.parser import ParsedTurn


class LongTailEnv(looprl.ToolEnv):
    """A `ToolEnv` whose every `every`-th episode sleeps `slow_s` seconds before each turn's
    answer (its state says `slow`)."""

    def __init__(self, *, every: int, slow_s: float, **kwargs: Any) -> None:
        if every < 1 or slow_s < 0:
            raise ValueError(f"every={every}, slow_s={slow_s}: use every >= 1 and slow_s >= 0")
        super().__init__(**kwargs)
        self.every, self.slow_s = every, slow_s
        self.started = 0  # episodes started so far

    async def setup_state(self, task: looprl.Task) -> dict[str, Any]:
        """The calculator's state, marked `slow` for every `every`-th episode."""
        state = await super().setup_state(task)
        self.started += 1
        state["slow"] = self.started % self.every == 0
        return state

    async def step(
        self, messages: list[looprl.Message], parsed: ParsedTurn, state: dict[str, Any]
    ) -> looprl.StepOutcome:
        """The calculator's answer to the turn, `slow_s` late in a slow episode."""
        if state["slow"]:
            await asyncio.sleep(self.slow_s)
        return await super().step(messages, parsed, state)


def load_environment(
    every: int = 16, slow_s: float = 2.0, max_turns: int = 4, max_tokens_per_turn: int = 96
) -> LongTailEnv:
    """The long-tail calculator: one episode in `every` is `slow_s` seconds slower per turn."""
    return LongTailEnv(
        every=every, slow_s=slow_s, name="long_tail", tools=[calculate],
        rubric=looprl.Rubric([correct_answer, answer_format], [1.0, 0.0]),
        train_tasks=lambda n, seed: generate_tasks("train", n, seed, env="long_tail"),
        eval_tasks=lambda n, seed: generate_tasks("eval", n, seed, env="long_tail"),
        limits=looprl.Limits(max_turns, max_tokens_per_turn, 1024), system_prompt=SYSTEM_PROMPT,
    )  # fmt: skip
