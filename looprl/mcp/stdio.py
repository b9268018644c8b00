"""The stdio transport of an MCP server: start it, read its replies under a byte cap, see it exit.

The MCP stdio transport is one JSON-RPC message per line on the server's stdout. This transport
reads the pipe in chunks into one buffer and parses a line only once it is whole and at most
`max_bytes` long. A longer line is never kept: its first 4 KB are searched for the message's
top-level `"id"`, the request with that id is answered at once with a JSON-RPC error that says
the reply was too large, and the rest of the line is read and dropped as it arrives. So a
100 MB reply costs the time to drain the pipe, not to hold and parse it, and the other calls on
the loop keep being answered. (The SDK's `stdio_client` grows one string per chunk and parses
the whole line; it also hides the process, whose exit code the restart message names.)

`StdioProcess` is what the session keeps: the process, and whether its stdout has ended (the
server exited or closed it), which is how a dead server is noticed between steps.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO, Any

from looprl.mcp.config import MCPServer

REPLY_TOO_LARGE = -32001
"""JSON-RPC error code of a reply over `max_reply_bytes` (an implementation-defined code)."""
_HEAD = 4096  # bytes of an oversized line searched for its id
_CHUNK = 65536
_STOP_GRACE = 2.0  # seconds after EOF on stdin before SIGTERM, then before SIGKILL (as the SDK)
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]]')
_ID_VALUE = re.compile(rb'\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')


@dataclass
class StdioProcess:
    """A started stdio server: its process and whether its stdout has ended."""

    process: Any
    """The `anyio` process."""
    ended: bool = False
    """The server's stdout reached end-of-file (it exited or closed it)."""

    @property
    def returncode(self) -> int | None:
        """The exit code, or None while it runs (a negative code is the signal that ended it)."""
        return self.process.returncode  # type: ignore[no-any-return]


def reply_id(head: bytes) -> int | str | None:
    """The top-level `"id"` of a JSON-RPC message from its first bytes, or None if not there."""
    depth = 0
    for token in _TOKEN.finditer(head):
        text = token.group()
        if text in (b"{", b"["):
            depth += 1
        elif text in (b"}", b"]"):
            depth -= 1
        elif depth == 1 and text == b'"id"':
            value = _ID_VALUE.match(head, token.end())
            if value is not None:
                return json.loads(value.group(1))  # type: ignore[no-any-return]
    return None


def too_large_message(max_bytes: int) -> str:
    """What the model reads when a reply was over `max_bytes`."""
    return (
        f"the reply was over {max_bytes} bytes (the server's max_reply_bytes), so it was dropped "
        "unread; ask for less"
    )


def too_large_error(head: bytes, max_bytes: int) -> Any:
    """The JSON-RPC error that answers an oversized reply, or None when its id is not found."""
    from mcp.shared.message import SessionMessage
    from mcp.types import ErrorData, JSONRPCError

    request = reply_id(head)
    if request is None:
        return None
    error = ErrorData(code=REPLY_TOO_LARGE, message=too_large_message(max_bytes))
    return SessionMessage(JSONRPCError(jsonrpc="2.0", id=request, error=error))


def parse_line(line: bytes) -> Any:
    """One stdout line as a `SessionMessage`, or the parse error (the session reports it)."""
    from mcp.shared.message import SessionMessage
    from mcp.types import jsonrpc_message_adapter

    try:
        return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def read_messages(stdout: Any, send: Any, max_bytes: int) -> None:
    """Send each stdout line to `send` as a message; a line over `max_bytes` as its error."""
    import anyio

    line = bytearray()
    dropping = False  # inside an oversized line: skip to its end
    while True:
        try:
            chunk = await stdout.receive(_CHUNK)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            return
        start = 0
        while start <= len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start : len(chunk) if end < 0 else end]
            if not dropping and len(line) + len(piece) > max_bytes:
                error = too_large_error(bytes(line[:_HEAD]) + piece[:_HEAD], max_bytes)
                if error is not None:
                    await send(error)
                line.clear()
                dropping = True
            elif not dropping:
                line += piece
            if end < 0:
                break
            if not dropping and line.strip():
                await send(parse_line(bytes(line)))
            line.clear()
            dropping = False
            start = end + 1


async def write_messages(stdin: Any, messages: Any) -> None:
    """Write each message from the session to the server's stdin, one JSON line each."""
    async for message in messages:
        data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
        await stdin.send((data + "\n").encode())


async def stop(process: Any) -> None:
    """Close stdin; SIGTERM the server's process group after 2 s, SIGKILL 2 s later (bounded)."""
    import anyio
    from mcp.os.posix.utilities import terminate_posix_process_tree

    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    with anyio.move_on_after(_STOP_GRACE):
        while process.returncode is None:
            await anyio.sleep(0.02)
    if process.returncode is None:
        await terminate_posix_process_tree(process, _STOP_GRACE)
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()


@contextlib.asynccontextmanager
async def stdio_transport(
    server: MCPServer, errlog: IO[str] | None
) -> AsyncIterator[tuple[Any, Any, StdioProcess]]:
    """Start `server.command` in a session of its own; yield the session's streams and process.

    The server gets the SDK's safe environment plus `server.env`; its stderr goes to `errlog`.
    On exit it is stopped (EOF, then SIGTERM, then SIGKILL to its process group).
    """
    import anyio
    from mcp.client.stdio import get_default_environment

    assert server.command is not None
    process = await anyio.open_process(
        server.command, env=get_default_environment() | server.env, stderr=errlog,
        cwd=server.cwd, start_new_session=True,
    )  # fmt: skip
    handle = StdioProcess(process)
    to_session, from_server = anyio.create_memory_object_stream[Any](0)
    to_server, from_session = anyio.create_memory_object_stream[Any](0)

    async def reader() -> None:
        try:
            async with to_session:  # closing it ends the session: calls in flight fail at once
                await read_messages(process.stdout, to_session.send, server.max_reply_bytes)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass  # the session ended first (shutdown)
        finally:
            handle.ended = True

    async def writer() -> None:
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            async with from_session:
                await write_messages(process.stdin, from_session)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            tg.start_soon(writer)
            try:
                yield from_server, to_server, handle
            finally:
                with anyio.CancelScope(shield=True):
                    await stop(process)
                tg.cancel_scope.cancel()
    finally:
        for stream in (from_server, to_server, to_session, from_session):
            await stream.aclose()
