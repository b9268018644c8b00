"""A small MCP server for tests/test_mcp*.py: a notepad, tools that fail, sleep, crash or reply big.

Run it over stdio (`python notes_server.py`) or streamable HTTP
(`python notes_server.py --http PORT`, bound to 127.0.0.1; `--json-response` answers calls with JSON
bodies instead of server-sent events). `--pid-file PATH` writes the
server's process id there, so a test can check that the process
is gone after shutdown. `--dangling-ref` gives `norm` a schema that refers to an undefined `$defs`
entry.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
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


@server.tool()
def crash(code: int) -> str:
    """Exit the server process at once with this exit code (its stderr says why)."""
    sys.stderr.write(f"crashing on purpose with code {code}\n")
    sys.stderr.flush()
    os._exit(code)


@server.tool()
def big(megabytes: float) -> str:
    """A reply of this many megabytes of text."""
    return "x" * int(megabytes * 1_000_000)


def main() -> None:
    """Serve over stdio, or over streamable HTTP on 127.0.0.1 with --http PORT."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http", type=int, default=None, help="serve HTTP on this port")
    parser.add_argument("--pid-file", type=Path, default=None, help="write the pid here")
    parser.add_argument("--dangling-ref", action="store_true", help="break norm's schema")
    parser.add_argument("--json-response", action="store_true", help="HTTP: JSON, not events")
    args = parser.parse_args()
    if args.pid_file is not None:
        args.pid_file.write_text(str(os.getpid()))
    if args.dangling_ref:
        tool = server._tool_manager.get_tool("norm")
        assert tool is not None
        tool.parameters["properties"]["point"] = {"$ref": "#/$defs/Missing"}
    if args.http is None:
        server.run("stdio")
    else:
        server.run(
            "streamable-http", host="127.0.0.1", port=args.http, json_response=args.json_response
        )


if __name__ == "__main__":
    main()
