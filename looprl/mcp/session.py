"""MCP client sessions on a loop of their own: start, call and stop servers from any event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import tempfile
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from looprl.mcp.config import MCPServer
from looprl.mcp.stdio import StdioProcess, stdio_transport, too_large_message
from looprl.tools.executor import MCP_ERROR, UNAVAILABLE, ToolError

_CLOSE_TIMEOUT = 15.0  # the stdio shutdown is bounded: 2 s for EOF, 2 s after SIGTERM
_SSE_TOO_LARGE = "byte limit"  # in httpx2's SSEError for an event over max_sse_event_size
_T = TypeVar("_T")


class MCPStartError(ValueError):
    """An MCP server did not start: a wrong command or URL, a crash, or no answer in time.

    A ValueError, as a bad setting is, so `looprl eval` and `looprl train` show it as one.
    """


def result_text(result: Any) -> str:
    """The text of a `CallToolResult`: its text blocks, a note per non-text block, else its JSON."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            text = getattr(block.resource, "text", None)
            parts.append(text if text is not None else f"[resource {block.resource.uri} (binary)]")
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        else:  # image, audio: the model reads text only
            parts.append(f"[{kind} ({getattr(block, 'mime_type', '?')}) not shown]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


class Loop:
    """An event loop on a daemon thread: the MCP sessions live here, whatever loop calls them."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="looprl-mcp", daemon=True)
        self.thread.start()
        self.sessions: set[Session] = set()
        self.closed = False

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Run `coro` on the MCP loop."""
        if self.closed:
            coro.close()
            raise ToolError(
                "the MCP servers were stopped (the environment is closed)",
                kind=UNAVAILABLE,
                infra=True,
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Await `coro` on the MCP loop from any other loop (cancelling it cancels the call)."""
        return await asyncio.wrap_future(self.submit(coro))

    def close(self) -> None:
        """Close every open session (stopping stdio servers), then the loop and its thread."""
        if self.closed:
            return
        if threading.current_thread() is self.thread:  # collected on the loop's own thread
            self.closed = True
            task = self.loop.create_task(close_all(list(self.sessions)))
            task.add_done_callback(lambda _: self.loop.stop())
            return
        if self.thread.is_alive():
            closing = self.submit(close_all(list(self.sessions)))
            with contextlib.suppress(concurrent.futures.TimeoutError):
                closing.result(timeout=_CLOSE_TIMEOUT + 5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
        self.closed = True
        if not self.thread.is_alive():
            self.loop.close()


async def close_all(sessions: list[Session]) -> None:
    """Close the sessions together (a session's close never raises)."""
    await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


async def open_all(sessions: list[Session]) -> None:
    """Open the sessions together; if one fails, close them all and raise its error."""
    results = await asyncio.gather(*(s.open() for s in sessions), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await close_all(sessions)
        raise errors[0]


def _first_error(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio wraps transport failures in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class Session:
    """One client session with one server, owned by a task on the MCP loop (anyio needs that)."""

    def __init__(self, server: MCPServer, owner: Loop) -> None:
        self.server = server
        self.owner = owner
        self.session: Any = None
        self.specs: list[Any] = []
        self.process: StdioProcess | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        stderr = tempfile.TemporaryFile("w+") if server.command is not None else None  # noqa: SIM115
        self._stderr = stderr  # the server's log, shown when it fails to start; closed in close()

    async def open(self) -> None:
        """Start the server (stdio) or connect (HTTP), initialize and list its tools."""
        self.owner.sessions.add(self)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._serve(ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.server.start_timeout)
        except asyncio.CancelledError:
            await self.close()
            raise
        except BaseException as exc:
            await self._end()  # the server has exited: its stderr is complete
            reason = (
                f"it did not answer within {self.server.start_timeout:g} s (start_timeout)"
                if isinstance(exc, TimeoutError)
                else f"{type(_first_error(exc)).__name__}: {_first_error(exc)}"
            )
            tail = self._stderr_tail()
            await self.close()
            raise MCPStartError(
                f"MCP server {self.server.label!r} failed to start: {reason}{tail}"
            ) from None

    async def _transport(self, stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
        """Enter the transport on `stack`: spawn a stdio server or open an HTTP client."""
        from mcp.client.streamable_http import streamable_http_client

        server = self.server
        if server.command is not None:
            read, write, self.process = await stack.enter_async_context(
                stdio_transport(server, self._stderr)
            )
            return read, write
        from looprl.mcp.http import http_client

        client = await stack.enter_async_context(
            http_client(server.headers, server.max_reply_bytes)
        )
        return await stack.enter_async_context(
            streamable_http_client(
                str(server.url), http_client=client, max_sse_event_size=server.max_reply_bytes
            )
        )

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._transport(stack)
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                self.specs = await _list_tools(session)
                self.session = session
                ready.set_result(None)
                await self._stop.wait()
        except asyncio.CancelledError:
            ready.cancel()  # a no-op once started
            raise
        except BaseException as exc:  # reported through `ready` while starting
            if not ready.done():
                ready.set_exception(exc)
        finally:
            self.session = None

    async def close(self) -> None:
        """End the session; a stdio server gets EOF, then SIGTERM and SIGKILL if it lingers."""
        await self._end()
        self.owner.sessions.discard(self)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    async def _end(self) -> None:
        """Stop the task that owns the session and wait for it (bounded)."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, _CLOSE_TIMEOUT)

    def _stderr_lines(self, lines: int) -> list[str]:
        """The last `lines` non-empty lines the server wrote to stderr."""
        if self._stderr is None:
            return []
        self._stderr.seek(0)
        return [line for line in self._stderr.read().splitlines() if line.strip()][-lines:]

    def _stderr_tail(self, lines: int = 15) -> str:
        tail = self._stderr_lines(lines)
        return ("\nits stderr ends with:\n" + "\n".join(tail)) if tail else ""

    @property
    def exited(self) -> bool:
        """A stdio server whose stdout has ended: it exited (or crashed) since it started."""
        return self.process is not None and self.process.ended

    async def close_exited(self) -> str:
        """Close the session of an exited server; returns how it ended, on one line."""
        await self._end()  # reaps the process: its exit code is known after this
        code = self.process.returncode if self.process is not None else None
        tail = " | ".join(line.strip() for line in self._stderr_lines(3))
        await self.close()
        note = f"code {code}" + (f", stderr ends: {tail}" if tail else "")
        return note if len(note) <= 300 else note[:297] + "..."

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Call a tool; an error result or JSON-RPC error is `mcp_error`, a lost server `unavailable`."""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        session = self.session
        gone = f"MCP server {self.server.label!r} is not connected"
        if session is None:
            raise ToolError(gone, kind=UNAVAILABLE, infra=True)
        try:
            result = await session.call_tool(name, arguments)
        except MCPError as exc:
            too_large = too_large_message(self.server.max_reply_bytes)
            if too_large in exc.message or (
                exc.code == CONNECTION_CLOSED and _SSE_TOO_LARGE in exc.message
            ):  # a JSON body (looprl.mcp.http) or an event (the SDK's cap) over max_reply_bytes
                raise ToolError(too_large, kind=MCP_ERROR) from None
            if exc.code == CONNECTION_CLOSED:
                raise ToolError(f"{gone} ({exc.message})", kind=UNAVAILABLE, infra=True) from None
            raise ToolError(exc.message, kind=MCP_ERROR) from None
        except Exception as exc:  # the transport failed: not the model's doing
            first = _first_error(exc)
            raise ToolError(
                f"{gone}: {type(first).__name__}: {first}", kind=UNAVAILABLE, infra=True
            ) from None
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or f"tool {name!r} failed without a message", kind=MCP_ERROR)
        return text


async def _list_tools(session: Any) -> list[Any]:
    """Every tool the server lists, following pagination."""
    specs: list[Any] = []
    cursor: str | None = None
    while True:
        from mcp.types import PaginatedRequestParams

        page = await session.list_tools(
            params=PaginatedRequestParams(cursor=cursor) if cursor else None
        )
        specs.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return specs
