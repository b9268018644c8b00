"""MCP server settings: `MCPServer` (a stdio command or a streamable-HTTP URL) and the SDK check."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

MCP_EXTRA = "mcp"


@dataclass(frozen=True)
class MCPServer:
    """One MCP server an environment takes tools from: a command (stdio) or a URL (HTTP).

    From TOML or `--env.mcp`, the same fields as a table:
    `mcp = [{command = ["python", "server.py"]}, {url = "http://127.0.0.1:8000/mcp", prefix = "web_"}]`.
    """

    command: list[str] | None = None
    """Program and arguments of a stdio server, started by looprl."""
    url: str | None = None
    """Endpoint of a streamable-HTTP server that is already running (`http://host:port/mcp`)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables of a stdio server."""
    cwd: str | None = None
    """Working directory of a stdio server."""
    headers: dict[str, str] = field(default_factory=dict)
    """HTTP headers sent to a URL server (e.g. `Authorization`)."""
    tools: list[str] | None = None
    """Offer only these of the server's tools (default: all)."""
    prefix: str = ""
    """Put before each tool's name (two servers with a tool of the same name need one)."""
    per_episode: bool = False
    """A fresh session (a fresh process, for stdio) per episode instead of one per environment."""
    start_timeout: float = 60.0
    """Seconds a server may take to start and list its tools."""
    max_reply_bytes: int = 4 * 1024 * 1024
    """Bytes one reply may have; a longer one is dropped unread and the call answered `mcp_error`.
    4 MiB is 1,000 times what a tool message shows by default (`max_tool_result_chars`, 4000)."""

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(
                "MCPServer needs exactly one of command=[program, *args] (a stdio server looprl "
                f"starts) or url='http://host:port/mcp' (a running server); got command="
                f"{self.command!r}, url={self.url!r}"
            )
        if self.command is not None and (
            isinstance(self.command, str)
            or not self.command
            or not all(isinstance(part, str) and part for part in self.command)
        ):
            raise ValueError(
                f"MCPServer command must be a non-empty list of strings like ['python', "
                f"'server.py'], got {self.command!r}"
            )
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"MCPServer url must start with http:// or https://, got {self.url!r}")
        if self.max_reply_bytes < 1024:
            raise ValueError(
                f"MCPServer max_reply_bytes must be >= 1024, got {self.max_reply_bytes}"
            )
        if self.start_timeout <= 0:
            raise ValueError(
                f"MCPServer start_timeout must be > 0 seconds, got {self.start_timeout}"
            )

    @classmethod
    def from_config(cls, value: MCPServer | Mapping[str, Any]) -> MCPServer:
        """An `MCPServer` from itself or a config table (TOML, `--env.mcp` JSON)."""
        if isinstance(value, MCPServer):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(
                f"an MCP server entry must be a table like {{command = ['python', 'server.py']}} "
                f"or {{url = 'http://127.0.0.1:8000/mcp'}}, got {value!r}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown MCP server field(s) {unknown}; choose from {sorted(known)}")
        return cls(**dict(value))

    @property
    def label(self) -> str:
        """How messages name the server: its command line or URL."""
        return " ".join(self.command) if self.command is not None else str(self.url)


def require_sdk() -> None:
    """Raise ImportError naming the extra unless the `mcp` SDK (2.x) is installed."""
    try:
        version = importlib.metadata.version("mcp")
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(
            f"MCP tools need the official MCP SDK: pip install -e '.[{MCP_EXTRA}]'"
        ) from None
    if int(version.split(".")[0]) < 2:
        raise ImportError(
            f"MCP tools need mcp>=2 (the installed version is {version}): "
            f"pip install -U -e '.[{MCP_EXTRA}]'"
        )
