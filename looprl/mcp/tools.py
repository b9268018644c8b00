"""MCP tools as looprl tools: schema conversion, argument checks, and `MCPTools`, which runs the servers."""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, TypeAdapter
from pydantic_core import PydanticCustomError
from rich.markup import escape

from looprl.console import console
from looprl.mcp.config import MCPServer, require_sdk
from looprl.mcp.session import Loop, MCPStartError, Session, close_all, open_all
from looprl.tools.schema import Param, Tool, clean_schema, object_schema

EPISODE_KEY = "mcp_sessions"
"""Episode-state key of the per-episode sessions (`MCPTools.open_episode`)."""
_HIDDEN = "looprl_mcp_sessions"  # the hidden parameter that receives state[EPISODE_KEY]
MAX_RESTARTS = 3
"""Restarts of one stdio server in a row (no check finding it alive between) before
`MCPTools.ensure_alive` gives up: a server that dies on every step will not be fixed by a fourth."""


def mcp_tool_schema(
    name: str, description: str | None, input_schema: Mapping[str, Any]
) -> dict[str, Any]:
    """The OpenAI function schema of an MCP tool, in the form `make_tool` gives Python tools."""
    defs = dict(input_schema.get("$defs", {}))
    properties = input_schema.get("properties", {})
    parameters = object_schema(
        {n: clean_schema(p, defs) for n, p in properties.items()},
        [n for n in input_schema.get("required", []) if n in properties],
        defs,
    )
    function = {"name": name, "description": (description or "").strip(), "parameters": parameters}
    return {"type": "function", "function": function}


def _validator(prop: Mapping[str, Any], defs: Mapping[str, Any], where: str) -> TypeAdapter[Any]:
    """A pydantic adapter that checks one argument against its JSON schema (jsonschema)."""
    import jsonschema

    schema = {**prop, "$defs": dict(defs)} if defs else dict(prop)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"{where}: the server's schema is invalid: {exc.message}") from exc
    checker = cls(schema)

    def check(value: Any) -> Any:
        error = jsonschema.exceptions.best_match(checker.iter_errors(value))
        if error is not None:  # a custom error keeps pydantic's "Value error, " off the message
            raise PydanticCustomError("json_schema", "{reason}", {"reason": error.message})
        return value

    return TypeAdapter(Annotated[Any, AfterValidator(check)])


def check_refs(input_schema: Mapping[str, Any], where: str) -> None:
    """Refuse (ValueError, one line) a `$ref` that is not `#/$defs/NAME` with NAME defined."""
    defs = input_schema.get("$defs", {})
    stack: list[Any] = [input_schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, Mapping):
            ref = node.get("$ref")
            if ref is not None and not (
                isinstance(ref, str)
                and ref.startswith("#/$defs/")
                and ref.removeprefix("#/$defs/") in defs
            ):
                raise ValueError(
                    f"{where}: its input schema refers to {ref!r}, which is not among its $defs "
                    f"{sorted(defs)} (looprl resolves '#/$defs/NAME' only), so the tool cannot be "
                    "offered — fix the server's schema, or leave the tool out with "
                    "MCPServer(tools=[...the others])"
                )
            stack.extend(node.values())


def _type_name(prop: Mapping[str, Any]) -> str:
    """A short form of a property's JSON type for the readable signature."""
    if "enum" in prop:
        return f"one of {json.dumps(prop['enum'])}"
    kind = prop.get("type")
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    return str(kind) if kind else "any"


def mcp_params(input_schema: Mapping[str, Any], where: str) -> tuple[dict[str, Param], str]:
    """The executor's view of an MCP tool's arguments: validators per property, readable signature."""
    properties = input_schema.get("properties", {})
    if input_schema.get("type", "object") != "object" or not isinstance(properties, Mapping):
        raise ValueError(
            f"{where}: the input schema must be a JSON object schema, got {input_schema!r}"
        )
    defs = dict(input_schema.get("$defs", {}))
    required = set(input_schema.get("required", []))
    params: dict[str, Param] = {}
    shown: list[str] = []
    for name, prop in properties.items():
        adapter = _validator(prop, defs, f"{where}, parameter {name!r}")
        params[name] = Param(name, Any, adapter, name in required, prop.get("default"))
        if name in required:
            default = ""
        else:
            default = f" = {json.dumps(prop['default'])}" if "default" in prop else " (optional)"
        shown.append(f"{name}: {_type_name(clean_schema(prop, defs))}{default}")
    return params, ", ".join(shown)


class MCPTools:
    """The tools of some MCP servers, ready for a `ToolExecutor`; starts the servers at once.

    `tools` are looprl `Tool`s (async). Servers with `per_episode=False` keep one session from
    here to `close()`; those with `per_episode=True` are started once to list their tools, then
    once per episode by `open_episode` (its result goes into the episode state) and stopped by
    `close_episode`. Raises MCPStartError (a ValueError) naming the server (and the end of its stderr) when one
    fails to start, ValueError on a tool-name clash or an unknown name in `MCPServer.tools`.
    """

    def __init__(self, servers: Iterable[MCPServer | Mapping[str, Any]]) -> None:
        self.servers = [MCPServer.from_config(s) for s in servers]
        require_sdk()
        self._loop = Loop()
        self._finalizer = weakref.finalize(self, self._loop.close)  # also runs at exit
        self._shared: dict[int, Session] = {}
        self._restarts: dict[int, int] = {}  # server index -> restarts in a row
        self._reviving = asyncio.Lock()  # used on the MCP loop only
        try:
            specs = self._loop.submit(self._start()).result()
            self.tools = self._build(specs)
        except BaseException:
            self.close()
            raise

    async def _start(self) -> list[list[Any]]:
        """Open every server's session; close the per-episode ones once their tools are listed."""
        sessions = [Session(s, self._loop) for s in self.servers]
        await open_all(sessions)
        for i, session in enumerate(sessions):
            if session.server.per_episode:
                await session.close()
            else:
                self._shared[i] = session
        return [s.specs for s in sessions]

    def _build(self, specs: list[list[Any]]) -> list[Tool]:
        tools: dict[str, Tool] = {}
        for i, (server, listed) in enumerate(zip(self.servers, specs, strict=True)):
            names = [spec.name for spec in listed]
            missing = sorted(set(server.tools or ()) - set(names))
            if missing:
                raise ValueError(
                    f"MCP server {server.label!r} has no tool(s) {missing}; it offers {sorted(names)}"
                )
            for spec in listed:
                if server.tools is not None and spec.name not in server.tools:
                    continue
                tool = self._tool(i, spec)
                if tool.name in tools:
                    raise ValueError(
                        f"two MCP tools are named {tool.name!r}; give one server a prefix "
                        "(MCPServer(prefix='name_')) or list the tools to keep (tools=[...])"
                    )
                tools[tool.name] = tool
        return list(tools.values())

    def _tool(self, index: int, spec: Any) -> Tool:
        """One server tool as a looprl `Tool` whose function calls it on the right session."""
        server = self.servers[index]
        name = server.prefix + spec.name
        schema = dict(spec.input_schema or {})
        where = f"MCP tool {name!r} of {server.label!r}"
        check_refs(schema, where)
        params, shown = mcp_params(schema, where)
        if _HIDDEN in params:
            raise ValueError(
                f"MCP tool {name!r} has a parameter named {_HIDDEN!r}, which looprl reserves"
            )
        loop, shared, remote = self._loop, self._shared, spec.name

        async def call_mcp_tool(**arguments: Any) -> str:
            episode = arguments.pop(_HIDDEN, None)
            session = episode[index] if episode is not None else shared[index]
            return await loop.run(session.call(remote, arguments))

        return Tool(
            name=name, fn=call_mcp_tool, schema=mcp_tool_schema(name, spec.description, schema),
            hidden={_HIDDEN: EPISODE_KEY} if server.per_episode else {}, is_async=True,
            params=params, signature=f"{name}({shown})",
        )  # fmt: skip

    @property
    def per_episode(self) -> bool:
        """Some server opens a session per episode."""
        return any(s.per_episode for s in self.servers)

    async def open_episode(self) -> dict[str, Any]:
        """Episode-state entries carrying the per-episode sessions (empty when there are none)."""
        if not self.per_episode:
            return {}
        return {EPISODE_KEY: await self._loop.run(self._open_episode())}

    async def _open_episode(self) -> dict[int, Session]:
        sessions = {i: Session(s, self._loop) for i, s in enumerate(self.servers) if s.per_episode}
        await open_all(list(sessions.values()))
        return sessions

    async def ensure_alive(self) -> None:
        """Restart each shared stdio server that exited since the last check; print one line each.

        Calls that were in flight when it died were answered `unavailable` (an infra fault). Stops
        the run (SystemExit, one line) when a server has exited after `MAX_RESTARTS` restarts in
        a row, or cannot start again. Per-episode servers start afresh anyway; an HTTP server is
        the user's to run.
        """
        if self.closed:
            return
        restarted, fatal = await self._loop.run(self._revive())
        for line in restarted:
            console.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False)
        if fatal:
            raise SystemExit(fatal)

    async def _revive(self) -> tuple[list[str], str | None]:
        """On the MCP loop: close and reopen the exited sessions; (lines to print, fatal error)."""
        restarted: list[str] = []
        async with self._reviving:  # a second caller finds the fresh session alive
            for i, session in list(self._shared.items()):
                if not session.exited:
                    self._restarts[i] = 0
                    continue
                label = session.server.label
                note = await session.close_exited()
                if self._restarts.get(i, 0) >= MAX_RESTARTS:
                    return restarted, (
                        f"error: MCP server {label!r} exited ({note}) after {MAX_RESTARTS} restarts "
                        "in a row, so the run stops — run its command by hand to see why, and fix it"
                    )
                fresh = Session(session.server, self._loop)
                try:
                    await fresh.open()
                except MCPStartError as exc:
                    reason = str(exc).splitlines()[0].split("failed to start: ", 1)[-1]
                    return restarted, (
                        f"error: MCP server {label!r} exited ({note}) and did not start again: "
                        f"{reason} — run its command by hand to see why, and fix it"
                    )
                self._shared[i] = fresh
                self._restarts[i] = self._restarts.get(i, 0) + 1
                restarted.append(f"MCP server {label!r} exited ({note}); restarted")
        return restarted, None

    async def close_episode(self, state: Mapping[str, Any]) -> None:
        """Close the sessions `open_episode` put in `state` (a no-op when there are none)."""
        sessions = state.get(EPISODE_KEY)
        if sessions and not self._loop.closed:
            await self._loop.run(close_all(list(sessions.values())))

    def close(self) -> None:
        """Stop every server and session (idempotent; also run at garbage collection and exit)."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        """`close()` has run."""
        return not self._finalizer.alive

    def __enter__(self) -> MCPTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
