"""A test environment with a sync tool that never returns, next to the calculator's tool."""

from __future__ import annotations

import threading
from typing import Any

from looprl import ToolEnv
from looprl.envs.calculator import load_environment as load_calculator

NEVER = threading.Event()  # never set: `hang` blocks its thread for good


def hang(seconds: float) -> str:
    """Pretend to wait `seconds`, but never return.

    Args:
        seconds: how long to wait.
    """
    NEVER.wait()
    return "unreachable"


def load_environment(
    tool_timeout: float = 0.3,
    max_hung_tool_calls: int = 256,
    tool_isolation: Any = "thread",
    **kwargs: Any,
) -> ToolEnv:
    """Calculator tasks and rubric; tools `calculate` and `hang` (which hangs)."""
    calc = load_calculator(**kwargs)
    return ToolEnv(
        name="hang",
        tools=[*calc.tools.values(), hang],
        rubric=calc.rubric,
        train_tasks=calc.train_tasks,
        eval_tasks=calc.eval_tasks,
        limits=calc.limits,
        system_prompt=calc.system_prompt,
        tool_timeout=tool_timeout,
        max_hung_tool_calls=max_hung_tool_calls,
        tool_isolation=tool_isolation,
    )
