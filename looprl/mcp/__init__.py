"""MCP tools: offer the tools of Model Context Protocol servers (stdio or streamable HTTP) to the model.

`MCPTools([MCPServer(command=[...]), MCPServer(url=...)])` starts the servers, lists their tools
and turns each into a looprl `Tool`: its schema is the server's input schema in the form
`looprl.tools.schema` gives Python tools (titles dropped, `$ref`s inlined), its arguments are
checked against that schema by the executor (so a bad call gets the usual `missing_argument`,
`unexpected_argument` or `invalid_argument`), and it runs as an async tool under the executor's
timeout and size cap. An error result from the server (`isError`) or a JSON-RPC error is the
model-visible kind `mcp_error`, and so is a reply over `MCPServer.max_reply_bytes`, which is
dropped as it is read (`looprl.mcp.stdio`, `looprl.mcp.http`); a server that is gone is
`unavailable`, an infrastructure fault. A stdio server that exited is restarted before the next
batch of episodes (`MCPTools.ensure_alive`, which `run_groups` calls), at most `MAX_RESTARTS`
times in a row.

The client sessions live on one event loop in a daemon thread owned by `MCPTools`, so they
outlive any one `asyncio.run` (the trainer and `looprl eval` each run their own) and calls from
any loop reach them. Sessions are per environment by default (one server process or HTTP session
shared by every episode, calls concurrent); `MCPServer(per_episode=True)` opens one per episode,
for servers whose state must not leak between episodes (measured costs: docs/environments.md).
`close()` stops every server; it also runs when the object is garbage-collected and at
interpreter exit (a normal end, an exception, Ctrl-C). A stdio server is started in its own
session, so a terminal's Ctrl-C reaches looprl only; if looprl is killed outright, the server
reads end-of-file on its stdin and exits, as the MCP stdio transport requires.
"""

from looprl.mcp.config import MCP_EXTRA, MCPServer
from looprl.mcp.session import MCPStartError, result_text
from looprl.mcp.tools import EPISODE_KEY, MCPTools, mcp_params, mcp_tool_schema
from looprl.tools.executor import MCP_ERROR

__all__ = [
    "EPISODE_KEY",
    "MCP_ERROR",
    "MCP_EXTRA",
    "MCPServer",
    "MCPStartError",
    "MCPTools",
    "mcp_params",
    "mcp_tool_schema",
    "result_text",
]
