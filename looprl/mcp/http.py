"""The HTTP client of a streamable-HTTP MCP server, with each JSON reply read under a byte cap.

A server answers a call either as a server-sent event (the SDK bounds each event with
`max_sse_event_size`, which the session sets to `max_reply_bytes`) or as one JSON body, which
the SDK reads whole. This client counts the bytes of every JSON body as they arrive and stops
past `max_reply_bytes` with an `httpx2.StreamError` carrying `too_large_message`: the SDK then
answers the call with a JSON-RPC error at once, instead of holding and parsing the whole body.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Mapping
from typing import Any

from looprl.mcp.stdio import too_large_message


@functools.cache
def _capped_body() -> type:
    """The class of a response body that raises `httpx2.StreamError` past its byte cap."""
    import httpx2

    class CappedBody(httpx2.AsyncByteStream):
        """`body`, cut off with a StreamError once more than `max_bytes` have arrived."""

        def __init__(self, body: Any, max_bytes: int) -> None:
            self.body = body
            self.max_bytes = max_bytes

        async def __aiter__(self) -> AsyncIterator[bytes]:
            seen = 0
            async for chunk in self.body:
                seen += len(chunk)
                if seen > self.max_bytes:
                    raise httpx2.StreamError(too_large_message(self.max_bytes))
                yield chunk

        async def aclose(self) -> None:
            await self.body.aclose()

    return CappedBody


def http_client(headers: Mapping[str, str], max_bytes: int) -> Any:
    """The SDK's default client (30 s timeouts, 300 s to read a stream), JSON bodies capped."""
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    async def cap_json(response: Any) -> None:  # before the body is read
        if response.headers.get("content-type", "").lower().startswith("application/json"):
            response.stream = _capped_body()(response.stream, max_bytes)

    return httpx2.AsyncClient(
        headers=dict(headers), event_hooks={"response": [cap_json]},
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
    )  # fmt: skip
