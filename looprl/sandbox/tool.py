"""The `python` tools an environment offers to the model, built on any sandbox executor.

`make_python_tools(executor)` returns two plain async functions: `python(code)` runs each call in
a fresh sandbox; `python_session(code, session_id)` runs in the episode's own interpreter, whose
variables persist across the episode's calls (ReTool / ToRL style). `session_id` is a hidden
parameter: it never appears in the schema and is filled from the episode state
(`state["sandbox_session"]`, see `SESSION_KEY`). The environment creates the id when an episode
starts (`new_session_id()`) and calls `executor.close_session(id)` when it ends. `python` takes
the same id, when the state has one, as its hidden `caller`: the pool shares its workers fairly
between episodes, so one episode's backlog of long calls does not hold up another's quick one.

Both return a `ToolReply`: the text the model reads (the status, then stdout, stderr and the
trailing expression's value, each cut to a readable size, with a plain-words message on every
failure) and the sandbox's status (`ok`, `timeout`, `sandbox_error`...), which the executor
records in the episode's `tool_outcomes` for rubrics to read.
"""

# No `from __future__ import annotations` here: the schema builder reads these signatures.
import secrets
from collections.abc import Awaitable, Callable
from typing import Annotated

from looprl.sandbox.base import ExecResult, Executor
from looprl.tools.executor import ToolReply
from looprl.tools.schema import Hidden

SESSION_KEY = "sandbox_session"
"""The episode-state key that holds the session id for `python_session`."""

_ADVICE = {
    "timeout": "Make the code faster, or print partial results as you go.",
    "memory": "Use less memory: smaller arrays, generators instead of lists.",
    "output_limit": "Print less: a summary, a slice, or the final answer only.",
    "killed": "Avoid deep recursion and native crashes; simplify the code.",
    "sandbox_error": "This was an infrastructure failure, not your code's fault; you may run it again.",
}


def new_session_id() -> str:
    """A fresh, unguessable session id for one episode."""
    return "ep-" + secrets.token_hex(8)


def _clip(text: str, limit: int) -> str:
    """Keep the head and the tail of long text, saying how much was cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}"


def format_result(result: ExecResult, max_chars: int = 4000) -> str:
    """The tool message for one result: status first, then the non-empty parts."""
    parts = [f"status: {result.status}"]
    if result.message:
        parts.append(f"message: {result.message}")
    budget = max_chars
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text:
            clipped = _clip(text, max(200, budget))
            budget = max(200, budget - len(clipped))
            parts.append(f"{name}:\n{clipped.rstrip()}")
    if result.value is not None:
        parts.append(f"value: {_clip(result.value, max(200, budget // 2))}")
    if result.truncated:
        parts.append("note: the output was cut at the sandbox's output limit")
    if result.status in _ADVICE:
        parts.append(_ADVICE[result.status])
    elif result.ok and len(parts) == 1:
        parts.append("(no output: use print() to see values)")
    return "\n".join(parts)


def make_python_tools(
    executor: Executor, *, timeout: float | None = None, max_chars: int = 4000
) -> tuple[Callable[..., Awaitable[ToolReply]], Callable[..., Awaitable[ToolReply]]]:
    """Build the stateless `python` tool and the per-episode `python_session` tool.

    Args:
        executor: The sandbox that runs the code (its limits apply).
        timeout: Seconds per call (default: the executor's limit).
        max_chars: Longest tool message section (stdout, stderr) shown to the model.
    """

    def reply(result: ExecResult) -> ToolReply:
        return ToolReply(format_result(result, max_chars), status=result.status)

    async def python(
        code: str, caller: Annotated[str | None, Hidden(SESSION_KEY)] = None
    ) -> ToolReply:
        """Run Python 3 code in a fresh sandbox and return what it printed.

        numpy and sympy are installed. There is no network and no file access outside the
        current directory. The value of a final bare expression is shown, like in a notebook.

        Args:
            code: The Python source code to run.
        """
        return reply(await executor.execute(code, timeout=timeout, caller=caller))

    async def python_session(
        code: str, session_id: Annotated[str, Hidden(SESSION_KEY)]
    ) -> ToolReply:
        """Run Python 3 code in your own persistent session and return what it printed.

        Variables, functions and imports persist between calls, like notebook cells. numpy and
        sympy are installed; there is no network. A timeout resets the session.

        Args:
            code: The Python source code to run.
        """
        return reply(await executor.execute(code, session_id=session_id, timeout=timeout))

    return python, python_session
