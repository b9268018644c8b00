"""A hand-written MCP stdio server for tests/test_mcp.py whose `big` reply is a 50 MB line at once.

It speaks just enough JSON-RPC (initialize, tools/list, tools/call) to offer two tools: `big`,
whose reply (built before the request arrives) is written in one go, so the time a client takes
is the client's own; and `add`, answered once `big`'s line has been written (one pipe, in order).
"""

from __future__ import annotations

import json
import sys

BIG = 50_000_000
TOOLS = [
    {"name": "big", "description": "A 50 MB reply.", "inputSchema": {"type": "object"}},
    {
        "name": "add",
        "description": "Add two integers.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
]


def reply(request: dict, big: bytes) -> bytes:
    """The JSON-RPC reply line to `request` (empty for a notification)."""
    method, ident = request.get("method"), request.get("id")
    if ident is None:
        return b""
    if method == "initialize":
        result = {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "big-reply", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call" and request["params"]["name"] == "big":
        head = json.dumps({"jsonrpc": "2.0", "id": ident}).encode()[:-1]
        return head + b',"result":{"content":[{"type":"text","text":"' + big + b'"}]}}\n'
    elif method == "tools/call":
        args = request["params"]["arguments"]
        result = {"content": [{"type": "text", "text": str(args["a"] + args["b"])}]}
    else:
        result = {}
    return (json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}) + "\n").encode()


def main() -> None:
    """Answer each stdin line on stdout until stdin ends."""
    big = b"x" * BIG
    for line in sys.stdin:
        if line.strip():
            sys.stdout.buffer.write(reply(json.loads(line), big))
            sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
