"""Hung sync tool calls: a warning as they add up, and a stop at the limit.

A thread cannot be killed, so under the executor's default threads every call that overruns its
timeout keeps its thread (`looprl.tools.threads`). `HungWatch` warns once at each of
`HUNG_WARNINGS` of the limit, naming the tools that hang most, and makes the `ToolsHung` error
that stops the run when the limit is reached: a run must not go on with no tools.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.markup import escape

from looprl.console import console
from looprl.tools.threads import ToolThreads

HUNG_WARNINGS = (0.25, 0.5, 0.75)
"""Fractions of the limit at which `HungWatch` warns, once each."""
FIXES = (
    "make the tool return within tool_timeout ({timeout:g} s), make it async, or run sync tools "
    'in killable processes (tool_isolation="process")'
)
"""What to do about a tool that hangs, in every warning and in the stop."""


class ToolsHung(RuntimeError):
    """So many sync tool calls hang that no thread may run another: the run must stop.

    Not a bad call of the model's: it escapes `ToolExecutor.run_one` and the episode, and stops
    `looprl eval` and `looprl train` with its one-line message (finished work is kept for
    `--resume`).
    """


class HungWatch:
    """Watches a pool's hung calls against `limit`; `warn` gets each warning line."""

    def __init__(
        self, limit: int, timeout: float, warn: Callable[[str], object] | None = None
    ) -> None:
        self.limit = limit
        self.fixes = FIXES.format(timeout=timeout)
        self.warn = warn or print_warning
        self._warned: set[float] = set()

    def check(self, pool: ToolThreads) -> None:
        """Warn the first time the pool's hung calls reach each of `HUNG_WARNINGS` of the limit."""
        hung = pool.abandoned
        crossed = [f for f in HUNG_WARNINGS if hung >= f * self.limit and f not in self._warned]
        if crossed:
            self._warned.update(crossed)
            self.warn(
                f"{hung} of at most {self.limit} sync tool calls hang on their threads "
                f"({hanging(pool)}); at {self.limit} the run stops: {self.fixes}"
            )

    def stop(self, pool: ToolThreads) -> ToolsHung:
        """The error that stops the run: the count, the limit, the tools that hang and the fix."""
        return ToolsHung(
            f"{pool.abandoned} sync tool calls hang on their threads, the limit "
            f"(max_hung_tool_calls={self.limit}); hanging: {hanging(pool)} — {self.fixes}, "
            "then rerun with --resume (finished work is kept)"
        )


def hanging(pool: ToolThreads) -> str:
    """The tools whose calls hang, most first: `'lookup' 60, 'fetch' 4`."""
    counts = pool.hung()
    shown = ", ".join(f"{name!r} {n}" for name, n in list(counts.items())[:3])
    return shown + (f" and {len(counts) - 3} more tools" if len(counts) > 3 else "")


def print_warning(message: str) -> None:
    """The default `warn`: one yellow `warning:` line on the console."""
    console.print(f"[yellow]warning:[/yellow] {escape(message)}", highlight=False, soft_wrap=True)
