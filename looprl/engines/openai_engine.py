"""An engine for any OpenAI-compatible server: chat messages for hosted APIs, token ids for vLLM.

Two modes:

- message level (`token_level=False`, for evaluating hosted models): POST `/chat/completions`
  with `request.messages` and `request.tools`; returns text and structured tool calls. A tool
  call whose `arguments` string is not a JSON object is kept, not dropped: it comes back as
  `ToolCall(name=..., arguments={}, raw=<the exact arguments text>)`, so the rollout can show it
  to the model and count it. Well-formed calls have `raw == ""`.
- token level (`token_level=True`, for training against vLLM): POST `/completions` with
  `prompt` = `request.prompt_ids`, `logprobs: 1` and vLLM's `return_tokens_as_token_ids: true`,
  which makes every entry of `choices[0].logprobs.tokens` a `"token_id:N"` string. The sampled
  ids are read from there (never re-encoded from text) with `token_logprobs` as their logprobs.

Requests run under a semaphore (`max_concurrency`), each attempt under a wall-clock `timeout`.
Connection errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff plus a small
seeded jitter (429 also honours `Retry-After`); other 4xx are not retried. A request that finally
fails returns `Generation(finish_reason="error", error=...)`: `generate` never raises.
A response's `usage` (prompt and completion tokens, as the server counted them) is kept on the
`Generation`, so a message-level evaluation reports real token counts and tokens/s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
import os
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from looprl.engines.base import GenerationRequest
from looprl.rendering.parser import strict_loads
from looprl.types import FinishReason, Generation, Message, SamplingParams, ToolCall

_TOKEN_ID_PREFIX = "token_id:"
_MAX_RETRY_AFTER_S = 60.0
# Connections per httpx client: 1 measured fastest of 1/2/4/16 at 256 concurrent requests.
_CONNECTIONS_PER_CLIENT = 1
_JSON_HEADERS = {"Content-Type": "application/json"}


class OpenAIEngine:
    """Sample assistant turns from an OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp, hosted APIs).

    `base_url` is the API root including `/v1` (e.g. `http://localhost:8000/v1`). `api_key`
    falls back to `$OPENAI_API_KEY`, else `"EMPTY"` (what local servers accept). `tokenizer`
    (anything with `decode(list[int]) -> str`) is optional: in token-level mode, when given, the
    returned `text` is decoded locally from the sampled ids instead of taken from the server
    (servers drop special tokens from `text` by default). `seed` seeds the retry jitter only.
    `stats` counts requests, retries, timeouts, connection errors, HTTP errors, final errors
    and malformed tool calls.
    """

    in_flight_updates = False  # it takes no weight updates at all

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        token_level: bool = False,
        max_concurrency: int = 32,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        tokenizer: Any = None,
        seed: int = 0,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if backoff < 0:
            raise ValueError(f"backoff must be >= 0 seconds, got {backoff}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must be an http(s) URL such as http://localhost:8000/v1, got {base_url!r}"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.token_level = token_level
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.tokenizer = tokenizer
        self.stats: dict[str, int] = {
            "requests": 0,
            "retries": 0,
            "timeouts": 0,
            "connection_errors": 0,
            "http_errors": 0,
            "errors": 0,
            "malformed_tool_calls": 0,
        }
        self._rng = random.Random(seed)
        self._clients: _ClientPool | None = None

    async def generate(self, request: GenerationRequest) -> Generation:
        """Sample one assistant turn; a failed request returns `finish_reason="error"`, never raises."""
        start = time.perf_counter()
        try:
            if self.token_level:
                path, payload = "/completions", self._completion_payload(request)
            else:
                path, payload = "/chat/completions", self._chat_payload(request)
            data = await self.post(path, payload)
            if self.token_level:
                gen = self._parse_completion(data)
                check_sampled(gen.token_ids or [], gen.logprobs or [], request, self.tokenizer)
            else:
                gen = self._parse_chat(data)
            gen.prompt_tokens, gen.completion_tokens = _usage(data)
        except RequestFailed as e:
            self.stats["errors"] += 1
            gen = Generation(text="", finish_reason="error", error=f"OpenAIEngine: {e}")
        gen.seconds = time.perf_counter() - start
        return gen

    async def close(self) -> None:
        """Close the HTTP connections (a later `generate` opens new ones).

        Call it from the event loop that ran `generate`: connections of a loop that has ended
        cannot be closed cleanly and are left to the garbage collector.
        """
        clients, self._clients = self._clients, None
        if clients is not None and clients.loop is asyncio.get_running_loop():
            await clients.aclose()

    # ----------------------------------------------------------------- requests

    def _chat_payload(self, request: GenerationRequest) -> dict[str, Any]:
        """The `/chat/completions` body for a message-level request."""
        if not request.messages:
            raise RequestFailed(
                "message-level request has no messages; fill GenerationRequest.messages"
            )
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [to_openai_message(m) for m in request.messages],
        }
        if request.tools:
            body["tools"] = request.tools
        body.update(self.sampling_fields(request.sampling))
        return body

    def _completion_payload(self, request: GenerationRequest) -> dict[str, Any]:
        """The `/completions` body for a token-level request (vLLM token ids in, token ids out)."""
        if request.prompt_ids is None:
            raise RequestFailed(
                "token_level=True needs GenerationRequest.prompt_ids (the rendered prompt token "
                "ids); use token_level=False to send chat messages instead"
            )
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(request.prompt_ids),
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        }
        body.update(self.sampling_fields(request.sampling))
        return body

    @staticmethod
    def sampling_fields(s: SamplingParams) -> dict[str, Any]:
        """Sampling parameters shared by both endpoints (top_k, a vLLM extra, only when set)."""
        out: dict[str, Any] = {
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
        }
        if s.stop:
            out["stop"] = list(s.stop)
        if s.seed is not None:
            out["seed"] = s.seed
        if s.top_k:
            out["top_k"] = s.top_k
        return out

    def _bind_to_loop(self) -> _ClientPool:
        """The HTTP clients for the running event loop (made anew if the loop changed)."""
        loop = asyncio.get_running_loop()
        if self._clients is None or self._clients.loop is not loop:
            headers = {"Authorization": f"Bearer {self.api_key}"}
            self._clients = _ClientPool(self.max_concurrency, headers, self.timeout, loop)
        return self._clients

    async def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST with bounded concurrency and retries; raise `RequestFailed` with the last error."""
        url = self.base_url + path
        try:
            body = json.dumps(payload).encode()
        except (TypeError, ValueError) as e:
            raise RequestFailed(f"the request is not JSON-serializable ({e}); check tools") from e
        attempts = self.max_retries + 1
        last_error = ""
        retry_after: float | None = None
        for attempt in range(attempts):
            if attempt:
                self.stats["retries"] += 1
                await asyncio.sleep(self._backoff_delay(attempt, retry_after))
            resp = await self._send_once(url, body)
            if isinstance(resp, str):  # timeout or connection error: retry
                last_error, retry_after = resp, None
                continue
            if resp.status_code == 200:
                return _json_object(resp, url)
            self.stats["http_errors"] += 1
            last_error = f"HTTP {resp.status_code}: {_snippet(resp)}"
            if resp.status_code != 429 and resp.status_code < 500:
                raise RequestFailed(
                    f"POST {url} was rejected with {last_error} (client errors are not retried; "
                    f"check the model name {self.model!r} and the request fields)"
                )
            retry_after = _retry_after(resp)
        raise RequestFailed(
            f"POST {url} failed after {attempts} attempt(s); last error: {last_error}"
        )

    async def _send_once(self, url: str, body: bytes) -> httpx.Response | str:
        """One attempt under a concurrency slot and the timeout: the response, or why it failed."""
        async with self._bind_to_loop().slot() as client:
            self.stats["requests"] += 1
            try:
                async with asyncio.timeout(self.timeout):
                    return await client.post(url, content=body, headers=_JSON_HEADERS)
            except (TimeoutError, httpx.TimeoutException):
                self.stats["timeouts"] += 1
                return f"timed out after {self.timeout:g} s (raise timeout= if the server is just slow)"
            except httpx.TransportError as e:
                self.stats["connection_errors"] += 1
                detail = str(e) or "no details"
                return f"connection error {type(e).__name__}: {detail} (is the server up at {self.base_url}?)"

    def _backoff_delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry `attempt` (1-based): exponential, jittered, >= Retry-After."""
        delay = self.backoff * 2 ** (attempt - 1) * (1.0 + 0.1 * self._rng.random())
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    # ----------------------------------------------------------------- responses

    def _parse_chat(self, data: dict[str, Any]) -> Generation:
        """Turn a `/chat/completions` response into a Generation (text + tool calls)."""
        choice = _first_choice(data)
        message = choice.get("message")
        if not isinstance(message, dict):
            raise RequestFailed(f"response choice has no message object: {_short(choice)}")
        calls = []
        for i, c in enumerate(message.get("tool_calls") or []):
            call = _parse_tool_call(c, i)
            if call.raw:
                self.stats["malformed_tool_calls"] += 1
            calls.append(call)
        return Generation(
            text=message.get("content") or "",
            tool_calls=calls,
            finish_reason=_finish_reason(choice.get("finish_reason")),
        )

    def _parse_completion(self, data: dict[str, Any]) -> Generation:
        """Turn a vLLM `/completions` response into a Generation with token ids and logprobs."""
        choice = _first_choice(data)
        lp = choice.get("logprobs")
        if not isinstance(lp, dict) or not isinstance(lp.get("tokens"), list):
            raise RequestFailed(
                "the server returned no logprobs for the sampled tokens; token_level=True needs a "
                "server that supports `logprobs` and `return_tokens_as_token_ids` (e.g. vLLM)"
            )
        ids = _token_ids(lp["tokens"], choice.get("token_ids"))
        logprobs = lp.get("token_logprobs") or []
        if len(logprobs) != len(ids) or any(not isinstance(x, int | float) for x in logprobs):
            raise RequestFailed(
                f"token_logprobs do not match the {len(ids)} sampled tokens: {_short(logprobs)}"
            )
        if self.tokenizer is not None:
            text = self.tokenizer.decode(ids)
        else:
            text = choice.get("text") or ""
        return Generation(
            text=text,
            token_ids=ids,
            logprobs=[float(x) for x in logprobs],
            finish_reason=_finish_reason(choice.get("finish_reason")),
        )


class _ClientPool:
    """`max_concurrency` request slots over httpx clients with tiny connection pools, on one loop.

    httpcore 1.0's connection pool does work proportional to connections x queued requests on
    every event, which caps one client near 100 requests/s at 256 connections. Here each client
    holds `_CONNECTIONS_PER_CLIENT` connections and a request takes a free slot (a client with
    spare capacity) from a free list, so the bookkeeping per request stays constant.
    """

    def __init__(
        self,
        max_concurrency: int,
        headers: dict[str, str],
        timeout: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        per = _CONNECTIONS_PER_CLIENT
        n = -(-max_concurrency // per)  # ceil division
        limits = httpx.Limits(max_connections=per, max_keepalive_connections=per)
        ssl_context = httpx.create_ssl_context()  # loading CA certificates once, not per client
        self.clients = [
            httpx.AsyncClient(
                headers=headers, timeout=httpx.Timeout(timeout), limits=limits, verify=ssl_context
            )
            for _ in range(n)
        ]
        self.free = collections.deque(i // per for i in range(max_concurrency))
        self.semaphore = asyncio.Semaphore(max_concurrency)
        self.loop = loop

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[httpx.AsyncClient]:
        """Hold one of `max_concurrency` slots (and its client) while the block runs."""
        async with self.semaphore:
            i = self.free.popleft()
            try:
                yield self.clients[i]
            finally:
                self.free.append(i)

    async def aclose(self) -> None:
        """Close every client's connections."""
        for client in self.clients:
            await client.aclose()


class RequestFailed(Exception):
    """A request that cannot produce a Generation; its message becomes `Generation.error`."""


LOGPROB_SLACK = 1e-4
"""Largest positive logprob accepted from a server (float rounding of a probability of 1)."""


def check_sampled(
    ids: list[int], logprobs: list[float], request: GenerationRequest, tokenizer: Any
) -> None:
    """Refuse a token-level reply the trainer cannot use (a `RequestFailed`: an infra error).

    Ids must lie in [0, vocabulary) (the tokenizer's length: an id past it decodes to nothing
    and indexes past the embedding in the update); logprobs must be finite and at most 0 (a NaN
    would poison every later weight); the reply may not be longer than `max_tokens` asked.
    """
    vocab = len(tokenizer) if tokenizer is not None and hasattr(tokenizer, "__len__") else None
    bad = [i for i in ids if i < 0 or (vocab is not None and i >= vocab)]
    if bad:
        where = f"[0, {vocab})" if vocab is not None else "[0, vocabulary)"
        raise RequestFailed(
            f"the server sampled token ids outside {where}: {_short(bad)}; check that it serves "
            "the model whose tokenizer the trainer uses (a padded vocabulary samples such ids)"
        )
    odd = [x for x in logprobs if not math.isfinite(x) or x > LOGPROB_SLACK]
    if odd:
        raise RequestFailed(
            f"the server returned logprobs that are not finite or are above 0: {_short(odd)}; "
            "the sampler's numbers are broken (check its dtype and kernels)"
        )
    limit = request.sampling.max_tokens
    if len(ids) > limit:
        raise RequestFailed(
            f"the server returned {len(ids)} tokens where max_tokens was {limit}; it ignored the "
            "limit, so the reply cannot be trusted"
        )


def to_openai_message(message: Message) -> dict[str, Any]:
    """A looprl Message in OpenAI chat format (tool-call arguments as a JSON string)."""
    d = message.to_template()
    for call in d.get("tool_calls", []):
        fn = call["function"]
        if not isinstance(fn["arguments"], str):
            fn["arguments"] = json.dumps(fn["arguments"], ensure_ascii=False)
    if message.role == "tool":
        d.pop("name", None)  # the OpenAI API's tool message has no `name` field
    return d


def _parse_tool_call(c: Any, index: int) -> ToolCall:
    """One OpenAI tool call; arguments that are not a JSON object are kept verbatim in `raw`."""
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict):
        return ToolCall(name="", arguments={}, id=f"call_{index}", raw=json.dumps(c) or "null")
    name = str(fn.get("name") or "")
    call_id = str(c.get("id") or f"call_{index}")
    args = fn.get("arguments")
    if isinstance(args, dict):
        return ToolCall(name=name, arguments=args, id=call_id)
    text = args if isinstance(args, str) else json.dumps(args)
    if isinstance(args, str) and not args.strip():
        return ToolCall(name=name, arguments={}, id=call_id)
    try:  # the same strict rules as tool calls parsed from text (no NaN, valid Unicode)
        parsed = strict_loads(text)
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict):
        return ToolCall(name=name, arguments=parsed, id=call_id)
    return ToolCall(name=name, arguments={}, id=call_id, raw=text)


def _token_ids(tokens: list[Any], fallback: Any) -> list[int]:
    """Sampled ids from vLLM's `"token_id:N"` tokens, else from a `token_ids` list of the same length."""
    try:
        if all(_is_id(t) for t in tokens):
            return [int(t[len(_TOKEN_ID_PREFIX) :]) for t in tokens]
        if isinstance(fallback, list) and len(fallback) == len(tokens):
            return [int(t) for t in fallback]
    except (TypeError, ValueError) as e:
        raise RequestFailed(f"cannot read token ids from {_short(tokens)}: {e}") from e
    raise RequestFailed(
        "the server did not return token ids (logprobs tokens are text, not 'token_id:N'); "
        "token_level=True needs a server that supports return_tokens_as_token_ids, e.g. vLLM; "
        "use token_level=False for servers without it"
    )


def _is_id(token: Any) -> bool:
    """Whether a logprobs token is a `"token_id:N"` placeholder."""
    return isinstance(token, str) and token.startswith(_TOKEN_ID_PREFIX)


def _json_object(resp: httpx.Response, url: str) -> dict[str, Any]:
    """The JSON object body of a 200 response, or a clear failure."""
    try:
        data = resp.json()
    except ValueError as e:
        raise RequestFailed(
            f"POST {url}: HTTP 200 but the body is not JSON: {_snippet(resp)}"
        ) from e
    if not isinstance(data, dict):
        raise RequestFailed(f"POST {url}: expected a JSON object, got {_snippet(resp)}")
    return data


def _first_choice(data: dict[str, Any]) -> dict[str, Any]:
    """`choices[0]` of a response, or a clear failure."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise RequestFailed(f"response has no choices: {_short(data)}")
    return choices[0]


def _usage(data: dict[str, Any]) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens from a response's `usage`; None for a count it lacks."""
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return None, None
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _count(value: Any) -> int | None:
    """A token count: a non-negative integer, else None (a server's `null` or nonsense)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _finish_reason(reason: Any) -> FinishReason:
    """Map an OpenAI finish reason to looprl's: `length` stays, everything else ends the turn."""
    return "length" if reason == "length" else "stop"


def _retry_after(resp: httpx.Response) -> float | None:
    """The `Retry-After` header in seconds (numeric form only), capped at 60 s."""
    value = resp.headers.get("retry-after")
    try:
        return min(max(float(value), 0.0), _MAX_RETRY_AFTER_S) if value is not None else None
    except ValueError:
        return None


def _snippet(resp: httpx.Response, limit: int = 300) -> str:
    """The start of a response body, for error messages."""
    text = resp.text.strip().replace("\n", " ")
    return (text[:limit] + "...") if len(text) > limit else (text or "<empty body>")


def _short(obj: Any, limit: int = 300) -> str:
    """A JSON-ish rendering of `obj`, cut to `limit` characters, for error messages."""
    text = json.dumps(obj, default=str)
    return (text[:limit] + "...") if len(text) > limit else text
