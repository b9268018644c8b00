"""The soak benchmark's environment: the calculator with faults injected at fixed, seeded rates.

Each call of `calculate` meets at most one fault, drawn from a hash of its expression:

- it hangs for good (its thread never returns) with probability `hang_rate`;
- it raises with probability `raise_rate`;
- it answers malformed output with probability `malformed_rate`: its result, a lone surrogate
  and a NaN, and on 1 such call in `huge_every` a further `HUGE_CHARS` characters;
- else it answers the result.

The reward is the answer's correctness plus `tool_weight` x `used_tool` (0: a metric only); the
correctness function raises on 1 episode in `raise_every`. Which calls and episodes fail is a
hash of their text, so a rerun injects the same faults. No system prompt (the soak's warm start is
trained on short prompts).
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
HUGE_CHARS = 1_000_000
"""Extra characters of a huge malformed answer (the executor cuts it to max_tool_result_chars)."""


def _uniform(text: str, salt: str) -> float:
    """A number in [0, 1) fixed by a hash of `text`."""
    digest = hashlib.sha256(f"{salt}|{text}".encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32


def _every(text: str, n: int, salt: str) -> bool:
    """True for about 1 in `n` texts, fixed by a hash (0 = never)."""
    return n > 0 and _uniform(text, salt) < 1 / n


def is_huge(expression: str, huge_every: int) -> bool:
    """A malformed answer to this expression is huge (1 in `huge_every`; 0 = never)."""
    return _every(expression, huge_every, "huge")


def fault_of(expression: str, hang_rate: float, raise_rate: float, malformed_rate: float) -> str:
    """The fault a call with this expression meets: `hang`, `raise`, `malformed` or `none`."""
    u = _uniform(expression, "fault")
    for fault, rate in (("hang", hang_rate), ("raise", raise_rate), ("malformed", malformed_rate)):
        if u < rate:
            return fault
        u -= rate
    return "none"


def load_environment(
    hang_rate: float = 0.1,
    raise_rate: float = 0.0,
    malformed_rate: float = 1 / 6,
    raise_every: int = 15,
    huge_every: int = 0,
    tool_weight: float = 0.0,
    **kwargs: Any,
) -> ToolEnv:
    """The faulty calculator (see the module doc); a rate of 0 turns its fault off."""
    rates = {"hang_rate": hang_rate, "raise_rate": raise_rate, "malformed_rate": malformed_rate}
    if min(rates.values()) < 0 or sum(rates.values()) > 1:
        raise ValueError(f"soak fault rates {rates} must be >= 0 and sum to at most 1")

    def faulty_calculate(expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: the expression, e.g. "12*(3+4)".
        """
        fault = fault_of(expression, hang_rate, raise_rate, malformed_rate)
        if fault == "hang":
            NEVER.wait()  # a tool that never returns
        if fault == "raise":
            raise RuntimeError("injected tool failure")
        result = calculate(expression)
        if fault == "malformed":
            huge = " " + "9" * HUGE_CHARS if is_huge(expression, huge_every) else ""
            return f"{result} \ud800 NaN{huge}"
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
        rubric=Rubric(
            [correct_or_raise, used_tool, tool_call_validity], weights=[1.0, tool_weight, 0.0]
        ),
        train_tasks=lambda n, seed: generate_tasks("train", n, seed),
        eval_tasks=lambda n, seed: generate_tasks("eval", n, seed),
        tool_timeout=float(kwargs.pop("tool_timeout", 1.0)),
        **kwargs,
    )
