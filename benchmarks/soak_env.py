"""The soak benchmark's environment: the calculator with faults injected at fixed, seeded rates.

- `calculate` hangs for good on 1 call in `hang_every` (its thread never returns);
- it answers with a lone surrogate and a NaN in its text on 1 call in `garble_every`;
- the reward function raises on 1 episode in `raise_every`.

Which calls and episodes fail is a hash of the call's text, so a rerun injects the same faults.
No system prompt (the soak's warm start is trained on short prompts).
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

from looprl.envs.base import ToolEnv
from looprl.envs.calculator import calculate, correct_answer, generate_tasks
from looprl.kit import tool_call_validity, used_tool
from looprl.rubrics import Rubric
from looprl.types import EpisodeResult

NEVER = threading.Event()


def _every(text: str, n: int, salt: str) -> bool:
    """True for about 1 in `n` texts, fixed by a hash (0 = never)."""
    if n <= 0:
        return False
    return int.from_bytes(hashlib.sha256(f"{salt}|{text}".encode()).digest()[:4], "little") % n == 0


def load_environment(
    hang_every: int = 10, garble_every: int = 6, raise_every: int = 15, **kwargs: Any
) -> ToolEnv:
    """The faulty calculator (see the module doc); rates are 1-in-N, 0 turns a fault off."""

    def faulty_calculate(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: the expression, e.g. "12*(3+4)".
        """
        if _every(expression, hang_every, "hang"):
            NEVER.wait()  # a tool that never returns
        result = calculate(expression)
        if _every(expression, garble_every, "garble"):
            return f"{result} \ud800 NaN"
        return str(result)

    def correct_or_raise(episode: EpisodeResult) -> float:
        """`correct_answer`, but raising for some episodes (a buggy reward function)."""
        if _every(f"{episode.task.id}|{episode.rollout_index}", raise_every, "raise"):
            raise RuntimeError("injected reward failure")
        return correct_answer(episode)

    faulty_calculate.__name__ = "calculate"
    return ToolEnv(
        name="soak",
        tools=[faulty_calculate],
        rubric=Rubric([correct_or_raise, used_tool, tool_call_validity], weights=[1.0, 0.0, 0.0]),
        train_tasks=lambda n, seed: generate_tasks("train", n, seed),
        eval_tasks=lambda n, seed: generate_tasks("eval", n, seed),
        tool_timeout=float(kwargs.pop("tool_timeout", 1.0)),
        **kwargs,
    )
