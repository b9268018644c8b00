"""A small MCP server for tests/test_mcp.py: a per-session notepad, a tool that fails, one that sleeps.

Run it over stdio (`python notes_server.py`) or streamable HTTP
(`python notes_server.py --http PORT`, bound to 127.0.0.1). `--pid-file PATH` writes the
server's process id there, so a test can check that the process is gone after shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

server = MCPServer("looprl-test-notes", log_level="WARNING")
NOTES: dict[str, list[str]] = {}  # HTTP session id ("" over stdio) -> its notes


class Point(BaseModel):
    """A point on the plane."""

    x: float
    y: float


def _session(ctx: Context) -> str:
    """The client's HTTP session id ("" over stdio, where the process is the session)."""
    request = ctx.request_context.request
    return request.headers.get("mcp-session-id", "") if request is not None else ""


@server.tool()
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def remember(text: str, ctx: Context) -> str:
    """Write down a note; notes last as long as the client's session."""
    notes = NOTES.setdefault(_session(ctx), [])
    notes.append(text)
    return f"noted ({len(notes)} so far)"


@server.tool()
def recall(ctx: Context) -> str:
    """Read back every note of this session, one per line."""
    return "\n".join(NOTES.get(_session(ctx), [])) or "(no notes)"


@server.tool()
def norm(point: Point) -> float:
    """The distance of a point from the origin."""
    return (point.x**2 + point.y**2) ** 0.5


@server.tool()
def fail(message: str) -> str:
    """Always fails with the given message (an error result the client sees)."""
    raise ToolError(message)


@server.tool()
async def sleep(seconds: float) -> str:
    """Wait, then say so."""
    await asyncio.sleep(seconds)
    return f"slept {seconds:g} s"


def main() -> None:
    """Serve over stdio, or over streamable HTTP on 127.0.0.1 with --http PORT."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", type=int, default=None, help="serve HTTP on this port")
    parser.add_argument("--pid-file", type=Path, default=None, help="write the pid here")
    args = parser.parse_args()
    if args.pid_file is not None:
        args.pid_file.write_text(str(os.getpid()))
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
