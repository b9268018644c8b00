"""Tool sources: where a `ToolEnv`'s tools come from, and what each episode opens and closes.

A source offers `tools` and may hold resources: for the whole run (started when the source is
built, stopped by `close()`) and per episode (`open_episode()` returns entries for the episode
state, where hidden tool arguments read them; `close_episode(state)` releases them). Two kinds
exist: `FunctionTools`, Python functions, which hold nothing, and `looprl.mcp.MCPTools`, the
tools of MCP servers, which start with it and may open a session per episode. Before each batch
of episodes (a training step, an evaluation) `ensure_alive()` restarts what died since the last.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from looprl.tools.schema import Tool, make_tools


class ToolSource(Protocol):
    """Tools offered to the model, with the run's and each episode's resources behind them."""

    tools: list[Tool]
    """The tools this source offers (names unique across an environment's sources)."""

    async def open_episode(self) -> dict[str, Any]:
        """Episode-state entries for one episode's resources (empty when there are none)."""
        ...

    async def close_episode(self, state: Mapping[str, Any]) -> None:
        """Release what `open_episode` put in `state`."""
        ...

    async def ensure_alive(self) -> None:
        """Restart the run's resources that died since the last call (a crashed server); the
        rollout calls it before each batch of episodes. Raises SystemExit when it cannot."""
        ...

    def close(self) -> None:
        """Release the run's resources; safe to call twice."""
        ...


class FunctionTools:
    """Python functions (or ready `Tool`s) as a tool source: nothing to open or close."""

    def __init__(self, fns: Iterable[Callable[..., Any] | Tool]) -> None:
        self.tools = list(make_tools(fns).values())

    async def open_episode(self) -> dict[str, Any]:
        """No per-episode state."""
        return {}

    async def close_episode(self, state: Mapping[str, Any]) -> None:
        """Nothing to release."""

    async def ensure_alive(self) -> None:
        """Nothing can die."""

    def close(self) -> None:
        """Nothing to release."""
