"""A scripted OpenAI-compatible HTTP server on 127.0.0.1 for tests and benchmarks: no model, no network.

`FakeOpenAIServer` serves `/v1/chat/completions`, `/v1/completions` (token level, vLLM style:
`return_tokens_as_token_ids` gives `"token_id:N"` tokens), vLLM's `/inference/v1/generate` and
`/v1/models` from a script, on an asyncio server in a background thread (hundreds of concurrent
keep-alive connections are fine).
It injects faults (500s, 429s, dropped connections, slow replies) and records every request.
vLLM's weight and adapter endpoints (`VLLM_ADMIN`) answer 200 and are recorded, so a
`VLLMEngine` on `base_urls=[srv.base_url]` can sync against it.

    with FakeOpenAIServer(script=["Hello!"]) as srv:
        engine = OpenAIEngine(srv.base_url, "fake")
        ...
        assert srv.request_count == 1

A script is either a callable `(request_json) -> FakeReply | str` or a list of replies. A list is
indexed per conversation: for a chat request by the number of assistant messages already in
`messages` (turn 0 gets item 0, turn 1 item 1, ..., cycling), for a completions request by the
number of completions requests served so far (token ids carry no conversation identity).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any

Script = Callable[[dict[str, Any]], "FakeReply | str"] | Sequence["FakeReply | str"] | None

VLLM_ADMIN = (
    "/collective_rpc", "/reset_prefix_cache", "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
    "/pause", "/resume", "/update_weight_version", "/abort_requests",
)  # fmt: skip
"""vLLM's dev-mode endpoints a `VLLMEngine` posts to when it syncs weights or adapters."""
GENERATE = "/inference/v1/generate"  # vLLM's token-in/token-out endpoint (`VLLMEngine`'s)


@dataclass
class FakeReply:
    """One scripted reply.

    `text` is the assistant content (chat) or completion text. `tool_calls` holds dicts
    `{"name": str, "arguments": dict | str}`; a string is sent verbatim (to script malformed JSON).
    `token_ids` / `logprobs` are the sampled ids and their logprobs for `/v1/completions`
    (default: the UTF-8 bytes of `text`, each with logprob -0.5). `status` other than 200 sends
    an error body with that status; `delay` sleeps before answering; `drop` closes the
    connection without any response. `body`, when set, is sent as the whole JSON response.
    """

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"
    status: int = 200
    delay: float = 0.0
    drop: bool = False
    body: dict[str, Any] | None = None


@dataclass
class RecordedRequest:
    """One request the server received: method, path, lower-cased headers and parsed JSON body."""

    method: str
    path: str
    headers: dict[str, str]
    json: dict[str, Any]


def count_assistant_turns(request_json: dict[str, Any]) -> int:
    """Number of assistant messages in a chat request: the 0-based index of the turn being asked for."""
    return sum(1 for m in request_json.get("messages") or [] if m.get("role") == "assistant")


class FakeOpenAIServer:
    """A real HTTP server on 127.0.0.1 (random free port) that answers from a script.

    Faults apply to the first requests in arrival order, one after another: the first
    `drop_first` requests are dropped (connection closed, no response), the next
    `rate_limit_first` get 429 with `Retry-After: 0`, the next `fail_first` get `fail_status`.
    `delay` slows every reply. With `support_token_ids=False` the completions endpoint ignores
    `return_tokens_as_token_ids` and returns text tokens, like a server without the vLLM extension.
    `models` are the ids `/v1/models` lists (default: `[model]`); `list_models=False` answers 404
    there, like servers without that route. With `api_key` set, a request without the header
    `Authorization: Bearer <api_key>` gets 401, as a hosted API answers a wrong key. Every reply
    carries a `usage` block; its token counts are whitespace-separated words (of the messages'
    contents for the prompt, of the text and tool-call arguments for the completion).
    Use it as a context manager, or call `start()` and `stop()`.
    """

    def __init__(
        self,
        script: Script = None,
        *,
        model: str = "fake-model",
        fail_first: int = 0,
        fail_status: int = 500,
        rate_limit_first: int = 0,
        drop_first: int = 0,
        delay: float = 0.0,
        support_token_ids: bool = True,
        models: Sequence[str] | None = None,
        list_models: bool = True,
        api_key: str | None = None,
    ) -> None:
        self.script = script
        self.model = model
        self.models = list(models) if models is not None else [model]
        self.list_models = list_models
        self.api_key = api_key
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.rate_limit_first = rate_limit_first
        self.drop_first = drop_first
        self.delay = delay
        self.support_token_ids = support_token_ids
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self._completions_served = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._start_error: BaseException | None = None

    # ----------------------------------------------------------------- lifecycle

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. `http://127.0.0.1:54321/v1`."""
        if not self.port:
            raise RuntimeError(
                "FakeOpenAIServer is not running; call start() or use it in a `with`"
            )
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def request_count(self) -> int:
        """How many HTTP requests arrived (including failed and dropped ones)."""
        return len(self.requests)

    def start(self) -> FakeOpenAIServer:
        """Start serving in a background thread; returns once the port is bound."""
        if self._thread is not None:
            raise RuntimeError("FakeOpenAIServer already started")
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="FakeOpenAIServer", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout=10):
            raise RuntimeError("FakeOpenAIServer did not start within 10 s")
        if self._start_error is not None:
            self._thread.join()
            self._thread = None
            raise RuntimeError(f"FakeOpenAIServer failed to start: {self._start_error}")
        return self

    def stop(self) -> None:
        """Close the listener and every open connection, then join the thread (idempotent)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
            with contextlib.suppress(Exception):
                fut.result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._thread = None
        self._loop = None
        self.port = 0

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self, ready: threading.Event) -> None:
        """Thread body: bind the listener, signal readiness, serve until stopped."""
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._serve_connection, "127.0.0.1", 0, backlog=4096)
            )
            self.port = self._server.sockets[0].getsockname()[1]
        except OSError as e:
            self._start_error = e
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        """Stop accepting, cancel every connection handler and wait for them."""
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # ----------------------------------------------------------------- HTTP

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Serve HTTP/1.1 keep-alive requests on one connection until the client closes it."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                method, path, headers = _parse_head(head)
                if "chunked" in headers.get("transfer-encoding", ""):
                    await _write(writer, 400, {"error": {"message": "chunked bodies unsupported"}})
                    return
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                keep_open = await self._answer(method, path, headers, body, writer)
                if not keep_open or headers.get("connection", "").lower() == "close":
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        except asyncio.CancelledError:
            # stop() cancels open connections. Finish normally: Python 3.11's stream callback
            # calls task.exception() on the finished handler, which raises for a cancelled task.
            return
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]
            writer.close()

    async def _answer(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer one request; returns False when the connection must be closed (dropped)."""
        index = len(self.requests)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            try:
                payload = json.loads(body) if body else {}
            except ValueError:
                payload = {}
                await _write(writer, 400, _error_body("request body is not JSON"))
                return True
            self.requests.append(RecordedRequest(method, path.split("?")[0], headers, payload))
            if (
                self.api_key is not None
                and headers.get("authorization") != f"Bearer {self.api_key}"
            ):
                await _write(writer, 401, _error_body("Incorrect API key provided"))
                return True
            fault = self._fault(index)
            if fault == "drop":
                return False
            if fault == "rate_limit":
                await _write(writer, 429, _error_body("rate limited"), {"Retry-After": "0"})
                return True
            if fault == "fail":
                await _write(writer, self.fail_status, _error_body("injected failure"))
                return True
            if self.delay:
                await asyncio.sleep(self.delay)
            return await self._route(method, path.split("?")[0], payload, writer)
        finally:
            self.in_flight -= 1

    def _fault(self, index: int) -> str | None:
        """Which injected fault (if any) the request with this arrival index gets."""
        if index < self.drop_first:
            return "drop"
        if index < self.drop_first + self.rate_limit_first:
            return "rate_limit"
        if index < self.drop_first + self.rate_limit_first + self.fail_first:
            return "fail"
        return None

    async def _route(
        self, method: str, path: str, payload: dict[str, Any], writer: asyncio.StreamWriter
    ) -> bool:
        """Dispatch to an endpoint and write its reply."""
        if method == "GET" and path == "/v1/models" and self.list_models:
            data = [{"id": m, "object": "model", "owned_by": "looprl"} for m in self.models]
            await _write(writer, 200, {"object": "list", "data": data})
            return True
        if method == "POST" and path in VLLM_ADMIN:  # accepted and recorded, nothing reloaded
            await _write(writer, 200, {})
            return True
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions", GENERATE):
            await _write(writer, 404, _error_body(f"no route for {method} {path}"))
            return True
        chat = path == "/v1/chat/completions"
        try:
            reply = self._scripted(payload, chat=chat)
            if reply.body is not None:
                out = reply.body
            elif chat:
                out = _chat_body(reply, payload, len(self.requests))
            elif path == GENERATE:
                out = _generate_body(reply, payload)
            else:
                out = self._completion_body(reply, payload)
        except Exception as e:  # the script is user code: report its failure as a 500
            await _write(writer, 500, _error_body(f"script failed: {type(e).__name__}: {e}"))
            return True
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.drop:
            return False
        if reply.status != 200:
            await _write(writer, reply.status, _error_body(f"scripted status {reply.status}"))
            return True
        await _write(writer, 200, out)
        return True

    def _scripted(self, payload: dict[str, Any], *, chat: bool) -> FakeReply:
        """The reply the script gives for this request."""
        script = self.script
        if script is None:
            reply: FakeReply | str = "ok"
        elif callable(script):
            reply = script(payload)
        else:
            if not script:
                raise ValueError("the reply list is empty")
            if chat:
                turn = count_assistant_turns(payload)
            else:
                turn = self._completions_served
                self._completions_served += 1
            reply = script[turn % len(script)]
        return FakeReply(text=reply) if isinstance(reply, str) else reply

    def _completion_body(self, reply: FakeReply, payload: dict[str, Any]) -> dict[str, Any]:
        """A `/v1/completions` response; logprobs only when the request asked for them."""
        ids, lps = _sampled(reply)
        choice: dict[str, Any] = {"index": 0, "text": reply.text, "logprobs": None,
                                  "finish_reason": reply.finish_reason}  # fmt: skip
        if payload.get("logprobs"):
            as_ids = self.support_token_ids and payload.get("return_tokens_as_token_ids")
            tokens = [f"token_id:{i}" if as_ids else chr(i % 0x110000) for i in ids]
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": lps,
                "top_logprobs": [{t: lp} for t, lp in zip(tokens, lps, strict=True)],
                "text_offset": list(range(len(ids))),
            }
        prompt = payload.get("prompt") or []
        return {
            "id": f"cmpl-fake-{len(self.requests)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": payload.get("model", self.model),
            "choices": [choice],
            "usage": _usage(len(prompt) if isinstance(prompt, list) else 0, len(ids)),
        }


def _sampled(reply: FakeReply) -> tuple[list[int], list[float]]:
    """The reply's token ids (default: the UTF-8 bytes of its text) and their logprobs."""
    ids = list(reply.token_ids) if reply.token_ids is not None else list(reply.text.encode())
    lps = list(reply.logprobs) if reply.logprobs is not None else [-0.5] * len(ids)
    if len(lps) != len(ids):
        raise ValueError("FakeReply.logprobs must have one entry per token id")
    return ids, lps


def _generate_body(reply: FakeReply, payload: dict[str, Any]) -> dict[str, Any]:
    """A `/inference/v1/generate` response: token ids and their logprobs, no weight labels."""
    ids, lps = _sampled(reply)
    content = [{"token_id": i, "logprob": lp} for i, lp in zip(ids, lps, strict=True)]
    choice = {"index": 0, "finish_reason": reply.finish_reason, "token_ids": ids,
              "logprobs": {"content": content}, "weight_versions": None}  # fmt: skip
    usage = _usage(len(payload.get("token_ids") or []), len(ids))
    return {"model": payload.get("model"), "choices": [choice], "usage": usage}


def _chat_body(reply: FakeReply, payload: dict[str, Any], serial: int) -> dict[str, Any]:
    """A `/v1/chat/completions` response with optional OpenAI-format tool calls."""
    calls = []
    for i, c in enumerate(reply.tool_calls):
        args = c.get("arguments", {})
        calls.append(
            {
                "id": c.get("id", f"call_{serial}_{i}"),
                "type": "function",
                "function": {
                    "name": c["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if calls:
        message["tool_calls"] = calls
    finish = "tool_calls" if calls and reply.finish_reason == "stop" else reply.finish_reason
    return {
        "id": f"chatcmpl-fake-{serial}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": payload.get("model", "fake-model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": _usage(_prompt_words(payload), _completion_words(reply)),
    }


def _prompt_words(payload: dict[str, Any]) -> int:
    """The fake's prompt token count of a chat request: words of the messages' text contents."""
    messages = payload.get("messages") or []
    return sum(len(str(m.get("content") or "").split()) for m in messages if isinstance(m, dict))


def _completion_words(reply: FakeReply) -> int:
    """The fake's completion token count: words of the text and of the tool calls' arguments."""
    args = [c.get("arguments", {}) for c in reply.tool_calls]
    texts = [a if isinstance(a, str) else json.dumps(a) for a in args]
    return sum(len(t.split()) for t in [reply.text, *texts])


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """An OpenAI `usage` block."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _error_body(message: str) -> dict[str, Any]:
    """An OpenAI-style error body."""
    return {"error": {"message": message, "type": "fake_server_error"}}


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Split an HTTP request head into method, path and lower-cased headers."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    method, path = (parts[0], parts[1]) if len(parts) >= 2 else ("", "")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    return method, path, headers


async def _write(
    writer: asyncio.StreamWriter,
    status: int,
    body: dict[str, Any],
    extra_headers: dict[str, str] | None = None,
) -> None:
    """Write one JSON response with a Content-Length (the connection stays open)."""
    data = json.dumps(body).encode()
    known = status in HTTPStatus._value2member_map_
    reason = HTTPStatus(status).phrase if known else "Error" if status >= 400 else "OK"
    head = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        "Connection: keep-alive",
    ]
    head += [f"{k}: {v}" for k, v in (extra_headers or {}).items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
    await writer.drain()
