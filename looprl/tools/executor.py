"""Tool execution: validate the model's calls, run them concurrently with timeouts, report every failure.

Bad calls are part of learning, not crashes. Each call of a turn ends in exactly one
`ToolResult` whose `content` is the tool message shown to the model; a failed call carries one
of the `ERROR_KINDS` and a message that says what went wrong and what the tool expects.

Sync tools run on daemon threads owned by the executor (`looprl.tools.threads`), so a slow
tool never blocks the event loop (other episodes keep sampling). A thread cannot be killed: a
sync tool that overruns its timeout is answered with a `timeout` message at once, its thread is
abandoned and replaced (the pool never starves), and it cannot keep the process alive at exit.
The timeout runs from the moment the call starts, never while it waits for a thread. As hung
calls pile up the executor warns once at each quarter of `max_hung` (naming the tools that hang
most); at `max_hung` it raises `ToolsHung`, which stops the run or evaluation with one line
rather than let it go on with every sync tool answered `unavailable`. With
`isolation="process"` a sync call runs in a forked child that is killed when it overruns, so
hung calls never add up (`looprl.tools.forked` says what that costs).

A call that overruns the executor's timeout is an *infrastructure* fault (`ToolResult.infra`):
the tool, not the model's call, failed to answer. The environment records it on the episode,
which then stays out of training and is retried by `looprl eval --resume`. A tool whose
slowness is the model's doing (code that loops) must bound it itself and return a message, as
the sandbox does. Tools that may hang for good belong in a sandbox process or should be async.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pydantic
import pydantic_core

from looprl.safe_json import clean_text
from looprl.tools.forked import call_in_child
from looprl.tools.hung import HungWatch, ToolsHung
from looprl.tools.schema import Tool, make_tool, make_tools
from looprl.tools.threads import ToolThreads, ToolThreadsExhausted
from looprl.types import Message, ToolCall, ToolOutcome

if TYPE_CHECKING:
    from looprl.rendering.parser import ParsedTurn, ParseError

MALFORMED_JSON = "malformed_json"
UNKNOWN_TOOL = "unknown_tool"
MISSING_ARGUMENT = "missing_argument"
UNEXPECTED_ARGUMENT = "unexpected_argument"
INVALID_ARGUMENT = "invalid_argument"
EXCEPTION = "exception"
TIMEOUT = "timeout"
UNAVAILABLE = "unavailable"
ERROR_KINDS = (
    MALFORMED_JSON,
    UNKNOWN_TOOL,
    MISSING_ARGUMENT,
    UNEXPECTED_ARGUMENT,
    INVALID_ARGUMENT,
    EXCEPTION,
    TIMEOUT,
    UNAVAILABLE,
)
MCP_ERROR = "mcp_error"
"""Kind of an MCP call the server answered with an error result or a JSON-RPC error (`looprl.mcp`);
the tool failed on the call, as a raising Python tool does (`exception`)."""
TRUNCATED = "truncated"
"""Counter name for results cut to `max_result_chars` (not an error kind)."""
_KIND = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*")
Isolation = Literal["thread", "process"]
ISOLATIONS: tuple[Isolation, ...] = ("thread", "process")
"""Where sync tools run: daemon threads (abandoned when hung), or a forked child per call (killed)."""


@dataclass
class ToolResult:
    """The outcome of one call: the tool message `content` and how the call went.

    `error_kind` is None on success, else one of `ERROR_KINDS`. `truncated` is True when the
    content was cut to the executor's `max_result_chars`. `seconds` is the wall time of the call.
    `infra` is True when the tool, not the model's call, failed (it hung past the timeout, or raised
    `ToolError(..., infra=True)`): the episode is then recorded as an infrastructure fault.
    """

    call_id: str
    """The id of the call answered."""
    name: str
    """The tool called."""
    content: str
    """The tool message the model reads."""
    error_kind: str | None = None
    """None on success, else the failure's kind."""
    seconds: float = 0.0
    """Wall time of the call."""
    truncated: bool = False
    """The content was cut to `max_result_chars`."""
    infra: bool = False
    """The tool, not the model's call, failed."""
    status: str = ""
    """The tool's own status from a `ToolReply`."""

    def to_message(self) -> Message:
        """The tool message answering the call."""
        return Message(role="tool", content=self.content, tool_call_id=self.call_id, name=self.name)

    def outcome(self) -> ToolOutcome:
        """The record of this call kept on the episode."""
        return ToolOutcome(
            name=self.name, call_id=self.call_id, error_kind=self.error_kind, status=self.status,
            seconds=self.seconds, truncated=self.truncated, infra=self.infra,
        )  # fmt: skip


class ToolError(Exception):
    """Raise it from a tool to fail a call with a kind of your own (else `exception`).

    `message` is what the model reads (after "Error: "); `kind` is counted in the episode's
    `tool_errors`; `infra=True` says the failure was not the model's (a backend down): the
    episode is then kept out of training and retried by `looprl eval --resume`.
    """

    def __init__(self, message: str, *, kind: str = "tool_error", infra: bool = False) -> None:
        super().__init__(message)
        if not _KIND.fullmatch(kind):
            raise ValueError(
                f"ToolError kind {kind!r} is not a short identifier; name the failure like "
                "'not_found' (letters, digits, '_', '.', '-'), and put the explanation in message"
            )
        self.kind = kind
        self.infra = infra


@dataclass
class ToolReply:
    """Return it from a tool to report a status of its own next to the text the model reads.

    `content` becomes the tool message; `status` (e.g. a sandbox's `ok` or `timeout`) is
    recorded in the episode's `tool_outcomes`, so rubrics read it without parsing text.
    """

    content: str
    """The text the model reads."""
    status: str = ""
    """A status of the tool's own, recorded in `ToolOutcome.status`."""


class _CallError(Exception):
    """A call that failed before or while running; carries its error kind and whose fault it is."""

    def __init__(self, kind: str, message: str, *, infra: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.infra = infra


def count_tool_errors(results: Iterable[ToolResult]) -> dict[str, int]:
    """Counts of failed calls by error kind, plus `truncated` for cut results (only kinds seen)."""
    counts: dict[str, int] = {}
    for r in results:
        for key in (r.error_kind, TRUNCATED if r.truncated else None):
            if key is not None:
                counts[key] = counts.get(key, 0) + 1
    return counts


class ToolExecutor:
    """Runs an environment's tools for the model's calls; never raises for a bad call.

    `timeout` (seconds) bounds each call; `max_result_chars` bounds each tool message;
    `max_threads` bounds the sync calls running at once (asyncio's default pool has only
    cpu_count + 4 threads, too few when many episodes call slow tools at once); hung calls do
    not count against it. `warn` gets one line at each of `looprl.tools.hung.HUNG_WARNINGS` of
    `max_hung` hung calls; the call that finds `max_hung` calls hanging raises `ToolsHung`. With
    `isolation="process"` each sync call runs in a forked child instead, killed when it
    overruns (`looprl.tools.forked`: no call ever hangs, but its side effects stay in the child).
    """

    def __init__(
        self,
        tools: Mapping[str, Tool | Callable[..., Any]] | Iterable[Tool | Callable[..., Any]],
        *,
        timeout: float = 10.0,
        max_result_chars: int = 4000,
        max_threads: int = 32,
        max_hung: int = 256,
        warn: Callable[[str], object] | None = None,
        isolation: Isolation = "thread",
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"ToolExecutor timeout must be > 0 seconds, got {timeout}")
        if max_result_chars < 1:
            raise ValueError(f"ToolExecutor max_result_chars must be >= 1, got {max_result_chars}")
        if max_threads < 1:
            raise ValueError(f"ToolExecutor max_threads must be >= 1, got {max_threads}")
        if max_hung < 1:
            raise ValueError(f"ToolExecutor max_hung must be >= 1, got {max_hung}")
        if isolation not in ISOLATIONS:
            raise ValueError(
                f"unknown tool isolation {isolation!r}; choose one of {', '.join(ISOLATIONS)}"
            )
        if isinstance(tools, Mapping):
            self.tools = _tools_from_mapping(tools)
        else:
            self.tools = make_tools(tools)
        self.timeout = timeout
        self.max_result_chars = max_result_chars
        self.max_threads = max_threads
        self.max_hung = max_hung
        self.isolation = isolation
        self._pool: ToolThreads | None = None
        self._watch = HungWatch(max_hung, timeout, warn)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of all tools, to offer the model (`tools=` of a chat template)."""
        return [t.schema for t in self.tools.values()]

    @property
    def state_keys(self) -> set[str]:
        """State keys the hidden parameters of the tools read (those without a default)."""
        return {
            key
            for t in self.tools.values()
            for param, key in t.hidden.items()
            if param not in t.hidden_defaults
        }

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Raise ValueError if `state` lacks a key some tool's hidden parameter needs.

        Call it once per episode after building the state, to catch an environment bug early.
        """
        missing = sorted(self.state_keys - set(state))
        if missing:
            users = sorted(
                t.name for t in self.tools.values() if set(t.hidden.values()) & set(missing)
            )
            raise ValueError(
                f"episode state lacks hidden tool argument(s) {missing} needed by tool(s) {users}; "
                "add them in the environment's setup_state"
            )

    async def run(self, calls: list[ToolCall], state: Mapping[str, Any]) -> list[ToolResult]:
        """Run the calls of one turn concurrently; one result per call, in the same order."""
        return list(await asyncio.gather(*(self.run_one(c, state) for c in calls)))

    async def run_turn(self, parsed: ParsedTurn, state: Mapping[str, Any]) -> list[ToolResult]:
        """Answer a whole parsed turn: run its calls and answer its parse errors, in written order."""
        results = {
            id(c): r for c, r in zip(parsed.calls, await self.run(parsed.calls, state), strict=True)
        }
        out: list[ToolResult] = []
        for item in parsed.ordered():
            out.append(results[id(item)] if isinstance(item, ToolCall) else self.error_result(item))
        return out

    def error_result(self, error: ParseError) -> ToolResult:
        """The tool message answering a malformed tool-call block (kind `malformed_json`)."""
        content, truncated = self._truncate(clean_text(f"Error: {error.message}"))
        return ToolResult(error.id, error.name, content, MALFORMED_JSON, 0.0, truncated)

    async def run_one(self, call: ToolCall, state: Mapping[str, Any]) -> ToolResult:
        """Validate and run one call; every failure becomes a result with its error kind.

        Raises `ToolsHung` (not a failure of the call) when `max_hung` sync calls hang.
        """
        start = time.perf_counter()
        kind: str | None = None
        infra = False
        status = ""
        try:
            tool = self._lookup(call.name)
            kwargs = self._arguments(tool, call.arguments)
            kwargs.update(_hidden_arguments(tool, state))
            value = await self._invoke(tool, kwargs)
            if isinstance(value, ToolReply):
                status = value.status
                value = value.content
            content = _encode(value)
        except _CallError as err:
            kind, content, infra = err.kind, f"Error: {err}", err.infra
        text, truncated = self._truncate(clean_text(content))
        seconds = time.perf_counter() - start
        return ToolResult(call.id, call.name, text, kind, seconds, truncated, infra, status)

    @property
    def hung_calls(self) -> int:
        """Sync calls abandoned after their timeout whose threads have not returned yet."""
        return self._pool.abandoned if self._pool is not None else 0

    def close(self) -> None:
        """Release the threads (threads still running a hung tool are daemons: they end with it)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _lookup(self, name: str) -> Tool:
        tool = self.tools.get(name)
        if tool is None:
            available = ", ".join(sorted(self.tools)) or "(none)"
            raise _CallError(UNKNOWN_TOOL, f"unknown tool {name!r}. Available tools: {available}.")
        return tool

    def _arguments(self, tool: Tool, arguments: Any) -> dict[str, Any]:
        """Validate the model's arguments against the visible signature (lax pydantic coercion)."""
        expects = f"The tool's signature is {tool.signature}."
        if not isinstance(arguments, dict):
            raise _CallError(
                MALFORMED_JSON,
                f"arguments of {tool.name!r} must be a JSON object, got {type(arguments).__name__}. {expects}",
            )
        extra = [k for k in arguments if k not in tool.params]
        if extra:
            raise _CallError(
                UNEXPECTED_ARGUMENT,
                f"{tool.name!r} got unexpected argument(s) {_names(extra)}. {expects}",
            )
        missing = [n for n, p in tool.params.items() if p.required and n not in arguments]
        if missing:
            raise _CallError(
                MISSING_ARGUMENT,
                f"{tool.name!r} is missing required argument(s) {_names(missing)}. {expects}",
            )
        values: dict[str, Any] = {}
        problems: list[str] = []
        for name, value in arguments.items():
            try:
                values[name] = tool.params[name].adapter.validate_python(value)
            except pydantic.ValidationError as exc:
                problems.extend(_describe(name, e) for e in exc.errors())
        if problems:
            raise _CallError(
                INVALID_ARGUMENT,
                f"invalid argument(s) for {tool.name!r}: {'; '.join(problems)}. {expects}",
            )
        return values

    async def _invoke(self, tool: Tool, kwargs: dict[str, Any]) -> Any:
        """Call the tool under the per-call timeout; every failure becomes a `_CallError`.

        A sync tool runs on a pool thread and its timeout starts when a thread picks it up; if
        it overruns (or the episode is cancelled) its thread is abandoned and replaced.
        """
        pool, future = None, None
        try:
            if tool.is_async:
                async with asyncio.timeout(self.timeout) as deadline:
                    return await tool.fn(**kwargs)
            if self.isolation == "process":  # killed, not abandoned, when it overruns
                async with asyncio.timeout(self.timeout) as deadline:
                    return await call_in_child(tool.fn, kwargs)
            pool = self._threads()
            future, started = self._submit(pool, tool, kwargs)
            await started.wait()
            async with asyncio.timeout(self.timeout) as deadline:
                return await asyncio.wrap_future(future)
        except TimeoutError as exc:
            if deadline.expired():
                raise self._timeout(tool) from None
            raise _CallError(EXCEPTION, _exception_text(exc)) from None
        except ToolError as exc:
            raise _CallError(exc.kind, str(exc), infra=exc.infra) from None
        except (_CallError, ToolsHung):
            raise
        except (Exception, SystemExit) as exc:  # the tool's own failure, reported to the model
            raise _CallError(EXCEPTION, _exception_text(exc)) from None
        finally:
            if pool is not None and future is not None and not future.done():
                pool.abandon(future)  # timed out or cancelled: free the thread's slot
                self._watch.check(pool)

    def _submit(
        self, pool: ToolThreads, tool: Tool, kwargs: dict[str, Any]
    ) -> tuple[concurrent.futures.Future[Any], asyncio.Event]:
        """Queue a sync call; the event is set when a thread starts it."""
        loop = asyncio.get_running_loop()
        started = asyncio.Event()
        call = functools.partial(contextvars.copy_context().run, tool.fn, **kwargs)
        try:
            future = pool.submit(
                call, on_start=lambda: loop.call_soon_threadsafe(started.set), label=tool.name
            )
        except ToolThreadsExhausted:
            raise self._watch.stop(pool) from None
        return future, started

    def _timeout(self, tool: Tool) -> _CallError:
        return _CallError(
            TIMEOUT, f"tool {tool.name!r} timed out after {self.timeout:g} s", infra=True
        )

    def _threads(self) -> ToolThreads:
        if self._pool is None:
            self._pool = ToolThreads(self.max_threads, max_abandoned=self.max_hung)
        return self._pool

    def _truncate(self, content: str) -> tuple[str, bool]:
        limit = self.max_result_chars
        if len(content) <= limit:
            return content, False
        return (
            f"{content[:limit]}\n[truncated: {len(content)} chars, showing the first {limit}]",
            True,
        )


def _tools_from_mapping(tools: Mapping[str, Tool | Callable[..., Any]]) -> dict[str, Tool]:
    """Tools from a name -> Tool (or function) mapping; a Tool's own name must match its key."""
    out: dict[str, Tool] = {}
    for key, value in tools.items():
        tool = value if isinstance(value, Tool) else make_tool(value, name=key)
        if tool.name != key:
            raise ValueError(
                f"tool mapping key {key!r} differs from the tool's name {tool.name!r}; use the same name"
            )
        out[key] = tool
    return out


def _hidden_arguments(tool: Tool, state: Mapping[str, Any]) -> dict[str, Any]:
    """Fill hidden parameters from the episode state; a missing key is an environment bug."""
    values: dict[str, Any] = {}
    for param, key in tool.hidden.items():
        if key in state:
            values[param] = state[key]
        elif param in tool.hidden_defaults:
            values[param] = tool.hidden_defaults[param]
        else:
            raise _CallError(
                EXCEPTION,
                f"tool {tool.name!r} could not run: the environment did not provide state {key!r} "
                f"for its hidden parameter {param!r} (an environment bug, not a mistake in your call)",
            )
    return values


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names)


def _describe(name: str, error: Mapping[str, Any]) -> str:
    """One pydantic error as `arg.path: message (got value)`."""
    loc = ".".join(str(part) for part in (name, *error.get("loc", ())))
    got = repr(error.get("input"))
    got = got if len(got) <= 60 else got[:57] + "..."
    return f"{loc}: {error.get('msg', 'invalid value')} (got {got})"


def _exception_text(exc: BaseException) -> str:
    """`ExceptionType: message`, without the traceback."""
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _encode(value: Any) -> str:
    """A tool's return value as message text: str as is, else JSON (repr when JSON cannot say it)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        pass
    try:
        return pydantic_core.to_json(value).decode()
    except (pydantic_core.PydanticSerializationError, TypeError, ValueError):
        return repr(value)
