"""OpenAIEngine against the scripted FakeOpenAIServer: replies, tool calls, token ids, faults, concurrency."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import pytest

from looprl.engines.base import Engine, GenerationRequest
from looprl.engines.openai_engine import OpenAIEngine, to_openai_message
from looprl.testing.fake_openai import FakeOpenAIServer, FakeReply, count_assistant_turns
from looprl.types import Message, SamplingParams, ToolCall

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def chat(text: str = "hi", **sampling: Any) -> GenerationRequest:
    """A one-message chat request."""
    return GenerationRequest(
        messages=[Message(role="user", content=text)], sampling=SamplingParams(**sampling)
    )


def engine(srv: FakeOpenAIServer, **kw: Any) -> OpenAIEngine:
    """An engine pointed at the fake server with fast retries."""
    kw.setdefault("backoff", 0.01)
    return OpenAIEngine(srv.base_url, "fake-model", **kw)


async def test_chat_reply_and_request_fields() -> None:
    with FakeOpenAIServer(script=["Hello there."]) as srv:
        eng = engine(srv, api_key="sk-test")
        assert isinstance(eng, Engine)
        gen = await eng.generate(chat("hi", max_tokens=7, temperature=0.5, stop=["\n"], seed=3))
        await eng.close()
    assert gen.text == "Hello there."
    assert gen.finish_reason == "stop" and gen.error is None
    assert gen.token_ids == [] and gen.tool_calls == []
    assert gen.seconds > 0
    (req,) = srv.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test"
    body = req.json
    assert body["model"] == "fake-model"
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["max_tokens"] == 7 and body["temperature"] == 0.5 and body["top_p"] == 1.0
    assert body["stop"] == ["\n"] and body["seed"] == 3
    assert "tools" not in body and "top_k" not in body  # omitted when empty / zero


async def test_top_k_sent_only_when_set_and_tools_passed_through() -> None:
    with FakeOpenAIServer() as srv:
        eng = engine(srv)
        req = chat("x", top_k=20)
        req.tools = [CALC_TOOL]
        gen = await eng.generate(req)
        await eng.close()
    assert gen.text == "ok"
    body = srv.requests[0].json
    assert body["top_k"] == 20
    assert body["tools"] == [CALC_TOOL]
    assert "seed" not in body and "stop" not in body


def test_api_key_falls_back_to_env_then_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert OpenAIEngine("http://x/v1", "m").api_key == "sk-env"
    monkeypatch.delenv("OPENAI_API_KEY")
    assert OpenAIEngine("http://x/v1", "m").api_key == "EMPTY"
    assert OpenAIEngine("http://x/v1", "m", api_key="k").api_key == "k"


def test_invalid_settings_are_rejected_with_the_field_name() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        OpenAIEngine("http://x/v1", "m", max_concurrency=0)
    with pytest.raises(ValueError, match="timeout"):
        OpenAIEngine("http://x/v1", "m", timeout=0)
    with pytest.raises(ValueError, match="base_url"):
        OpenAIEngine("localhost:8000/v1", "m")


async def test_multi_turn_tool_calls_round_trip() -> None:
    def script(req: dict[str, Any]) -> FakeReply:
        turn = count_assistant_turns(req)
        if turn == 0:
            return FakeReply(
                text="Let me add.",
                tool_calls=[
                    {"name": "add", "arguments": {"a": 2, "b": 3}},
                    {"name": "add", "arguments": '{"a": 2, "b": '},  # malformed JSON
                ],
            )
        tool_msgs = [m for m in req["messages"] if m["role"] == "tool"]
        return FakeReply(text=f"The answer is {tool_msgs[0]['content']}.")

    with FakeOpenAIServer(script=script) as srv:
        eng = engine(srv)
        req = chat("What is 2+3?")
        req.tools = [CALC_TOOL]
        first = await eng.generate(req)
        assert first.text == "Let me add." and first.finish_reason == "stop"
        good, bad = first.tool_calls
        assert (good.name, good.arguments, good.raw) == ("add", {"a": 2, "b": 3}, "")
        assert good.id  # the server's call id, needed to answer the call
        assert (bad.name, bad.arguments, bad.raw) == ("add", {}, '{"a": 2, "b": ')
        assert eng.stats["malformed_tool_calls"] == 1

        req.messages += [
            Message(role="assistant", content=first.text, tool_calls=[good]),
            Message(role="tool", content="5", tool_call_id=good.id, name="add"),
        ]
        second = await eng.generate(req)
        await eng.close()
    assert second.text == "The answer is 5."
    sent = srv.requests[1].json["messages"]
    assert sent[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert sent[2] == {"role": "tool", "content": "5", "tool_call_id": good.id}


def test_to_openai_message_serializes_arguments_once() -> None:
    msg = Message(role="assistant", tool_calls=[ToolCall(name="f", arguments={"x": "é"}, id="c1")])
    d = to_openai_message(msg)
    assert d["tool_calls"][0]["function"]["arguments"] == '{"x": "é"}'
    assert json.loads(d["tool_calls"][0]["function"]["arguments"]) == {"x": "é"}
    assert msg.tool_calls[0].arguments == {"x": "é"}  # the source message is untouched


async def test_token_level_reply_has_ids_and_logprobs() -> None:
    reply = FakeReply(
        text="<ok>", token_ids=[17, 4, 99], logprobs=[-0.1, -2.5, -0.0], finish_reason="length"
    )
    with FakeOpenAIServer(script=[reply]) as srv:
        eng = engine(srv, token_level=True)
        gen = await eng.generate(
            GenerationRequest(prompt_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=3))
        )
        await eng.close()
    assert gen.error is None
    assert gen.token_ids == [17, 4, 99]
    assert gen.logprobs == [-0.1, -2.5, 0.0]
    assert gen.text == "<ok>" and gen.finish_reason == "length"
    body = srv.requests[0].json
    assert srv.requests[0].path == "/v1/completions"
    assert body["prompt"] == [1, 2, 3]
    assert body["logprobs"] == 1 and body["return_tokens_as_token_ids"] is True
    assert body["max_tokens"] == 3


async def test_token_level_text_decoded_locally_with_tokenizer() -> None:
    class Decoder:
        def decode(self, ids: list[int]) -> str:
            return "|".join(map(str, ids))

    with FakeOpenAIServer(script=[FakeReply(text="server text", token_ids=[8, 9])]) as srv:
        eng = engine(srv, token_level=True, tokenizer=Decoder())
        gen = await eng.generate(GenerationRequest(prompt_ids=[1]))
        await eng.close()
    assert gen.text == "8|9" and gen.token_ids == [8, 9]


async def test_token_level_server_without_token_ids_fails_clearly() -> None:
    with FakeOpenAIServer(script=["abc"], support_token_ids=False) as srv:
        eng = engine(srv, token_level=True)
        gen = await eng.generate(GenerationRequest(prompt_ids=[1]))
        await eng.close()
    assert gen.finish_reason == "error"
    assert (
        gen.error is not None and "return_tokens_as_token_ids" in gen.error and "vLLM" in gen.error
    )
    assert srv.request_count == 1  # not retried: retrying cannot help
    assert eng.stats["errors"] == 1


async def test_token_level_without_prompt_ids_is_an_error_not_a_request() -> None:
    with FakeOpenAIServer() as srv:
        eng = engine(srv, token_level=True)
        gen = await eng.generate(chat("hi"))
        await eng.close()
    assert gen.finish_reason == "error" and gen.error is not None and "prompt_ids" in gen.error
    assert srv.request_count == 0


async def test_500s_then_success_counts_retries() -> None:
    with FakeOpenAIServer(script=["finally"], fail_first=2) as srv:
        eng = engine(srv, max_retries=3)
        gen = await eng.generate(chat())
        await eng.close()
    assert gen.text == "finally" and gen.error is None
    assert srv.request_count == 3
    assert eng.stats["retries"] == 2 and eng.stats["http_errors"] == 2
    assert eng.stats["requests"] == 3 and eng.stats["errors"] == 0


async def test_all_500s_give_an_error_generation_with_a_clear_message() -> None:
    with FakeOpenAIServer(fail_first=100) as srv:
        eng = engine(srv, max_retries=3)
        gen = await eng.generate(chat())
        await eng.close()
    assert gen.finish_reason == "error" and gen.text == ""
    assert gen.error is not None
    assert (
        "HTTP 500" in gen.error and "4 attempt(s)" in gen.error and "injected failure" in gen.error
    )
    assert srv.request_count == 4
    assert eng.stats["errors"] == 1 and eng.stats["retries"] == 3


async def test_429_is_retried_and_other_4xx_is_not() -> None:
    with FakeOpenAIServer(script=["after wait"], rate_limit_first=1) as srv:
        eng = engine(srv)
        gen = await eng.generate(chat())
        await eng.close()
    assert gen.text == "after wait" and srv.request_count == 2

    with FakeOpenAIServer(script=lambda req: FakeReply(status=400)) as srv:
        eng = engine(srv, max_retries=3)
        gen = await eng.generate(chat())
        await eng.close()
    assert gen.finish_reason == "error" and gen.error is not None
    assert "HTTP 400" in gen.error and "not retried" in gen.error
    assert srv.request_count == 1 and eng.stats["retries"] == 0


async def test_timeout_gives_an_error_generation() -> None:
    with FakeOpenAIServer(delay=2.0) as srv:
        eng = engine(srv, timeout=0.2, max_retries=1)
        gen = await eng.generate(chat())
        await eng.close()
    assert gen.finish_reason == "error" and gen.error is not None
    assert "timed out after 0.2 s" in gen.error and "2 attempt(s)" in gen.error
    assert eng.stats["timeouts"] == 2
    assert gen.seconds < 1.5


async def test_slow_first_reply_times_out_then_retry_succeeds() -> None:
    calls = {"n": 0}

    def script(req: dict[str, Any]) -> FakeReply:
        calls["n"] += 1
        return FakeReply(text="slow", delay=2.0) if calls["n"] == 1 else FakeReply(text="fast")

    with FakeOpenAIServer(script=script) as srv:
        eng = engine(srv, timeout=0.2, max_retries=2)
        gen = await eng.generate(chat())
        await eng.close()
    assert gen.text == "fast" and eng.stats["timeouts"] == 1 and eng.stats["retries"] == 1


async def test_dropped_connection_is_retried() -> None:
    with FakeOpenAIServer(script=["survived"], drop_first=1) as srv:
        eng = engine(srv)
        gen = await eng.generate(chat())
        await eng.close()
    assert gen.text == "survived" and gen.error is None
    assert srv.request_count == 2
    assert eng.stats["connection_errors"] == 1 and eng.stats["retries"] == 1


async def test_unreachable_server_is_an_error_not_an_exception() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    eng = OpenAIEngine(f"http://127.0.0.1:{port}/v1", "m", max_retries=1, backoff=0.01)
    gen = await eng.generate(chat())
    await eng.close()
    assert gen.finish_reason == "error" and gen.error is not None
    assert "connection error" in gen.error and f"127.0.0.1:{port}" in gen.error


async def test_concurrency_is_bounded() -> None:
    with FakeOpenAIServer(delay=0.1) as srv:
        eng = engine(srv, max_concurrency=4)
        gens = await asyncio.gather(*(eng.generate(chat(str(i))) for i in range(16)))
        await eng.close()
    assert all(g.text == "ok" for g in gens)
    assert srv.request_count == 16
    assert srv.max_in_flight == 4  # reached, never exceeded


async def test_a_few_failures_do_not_break_the_other_requests() -> None:
    def script(req: dict[str, Any]) -> FakeReply:
        content = req["messages"][0]["content"]
        if content.startswith("fail"):
            return FakeReply(status=503)
        return FakeReply(text=f"echo {content}", delay=0.01)

    prompts = [f"fail {i}" if i % 16 == 0 else f"q{i}" for i in range(64)]
    with FakeOpenAIServer(script=script) as srv:
        eng = engine(srv, max_concurrency=16, max_retries=1)
        gens = await asyncio.gather(*(eng.generate(chat(p)) for p in prompts))
        await eng.close()
    for p, g in zip(prompts, gens, strict=True):
        if p.startswith("fail"):
            assert g.finish_reason == "error" and g.error is not None and "HTTP 503" in g.error
        else:
            assert g.text == f"echo {p}" and g.error is None
    assert eng.stats["errors"] == 4
    assert srv.request_count == 60 + 4 * 2


def test_engine_is_reusable_across_event_loops() -> None:
    async def generate_and_close(eng: OpenAIEngine) -> str:
        gen = await eng.generate(chat())
        await eng.close()
        return gen.text

    with FakeOpenAIServer(script=["a"]) as srv:
        eng = engine(srv)
        assert asyncio.run(generate_and_close(eng)) == "a"
        assert asyncio.run(generate_and_close(eng)) == "a"  # a new loop gets new connections
    assert srv.request_count == 2


def test_fake_server_models_route_and_stop() -> None:
    with FakeOpenAIServer(model="tiny") as srv:
        base = srv.base_url
        r = httpx.get(base + "/models")
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "tiny"
        assert httpx.post(base + "/nowhere", json={}).status_code == 404
    assert srv.port == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/models")


def test_fake_server_reply_list_cycles_per_conversation() -> None:
    with FakeOpenAIServer(script=["first", "second"]) as srv:
        url = srv.base_url + "/chat/completions"
        user = {"role": "user", "content": "x"}
        turn0 = httpx.post(url, json={"messages": [user]}).json()
        again = httpx.post(url, json={"messages": [user]}).json()  # a new conversation
        turn1 = httpx.post(
            url, json={"messages": [user, {"role": "assistant", "content": "first"}, user]}
        ).json()
    texts = [r["choices"][0]["message"]["content"] for r in (turn0, again, turn1)]
    assert texts == ["first", "first", "second"]


def test_fake_server_reports_script_errors_as_500() -> None:
    def script(req: dict[str, Any]) -> str:
        raise KeyError("boom")

    with FakeOpenAIServer(script=script) as srv:
        r = httpx.post(srv.base_url + "/chat/completions", json={"messages": []})
    assert r.status_code == 500 and "KeyError" in r.json()["error"]["message"]


async def test_fake_server_serves_256_concurrent_connections() -> None:
    with FakeOpenAIServer(script=["ok"], delay=0.3) as srv:
        eng = engine(srv, max_concurrency=256, timeout=30.0)
        gens = await asyncio.gather(*(eng.generate(chat(str(i))) for i in range(256)))
        await eng.close()
    assert [g.error for g in gens] == [None] * 256
    assert srv.request_count == 256
    assert srv.max_in_flight > 16  # requests really overlapped on the server
    assert eng.stats["retries"] == 0


class _Vocab:
    """A tokenizer of 100 ids that decodes ids as digits."""

    def __len__(self) -> int:
        return 100

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (FakeReply(token_ids=[5, 100], logprobs=[-0.1, -0.2]), ["outside [0, 100)", "100"]),
        (FakeReply(token_ids=[5, -3], logprobs=[-0.1, -0.2]), ["outside [0, 100)", "-3"]),
        (FakeReply(token_ids=[5, 6], logprobs=[-0.1, float("nan")]), ["not finite", "NaN"]),
        (FakeReply(token_ids=[5, 6], logprobs=[-0.1, float("-inf")]), ["not finite"]),
        (FakeReply(token_ids=[5, 6], logprobs=[-0.1, 5.0]), ["above 0", "5.0"]),
        (FakeReply(token_ids=[5, 6, 7, 8], logprobs=[-0.1] * 4), ["4 tokens", "max_tokens was 3"]),
    ],
)
async def test_a_token_level_reply_the_trainer_cannot_use_is_an_error(reply, words) -> None:
    """Out-of-vocabulary ids, NaN/inf/positive logprobs and over-long replies never reach the
    trainer: the request fails (an infra error for the episode) with what was wrong."""
    with FakeOpenAIServer(script=[reply]) as srv:
        eng = engine(srv, token_level=True, tokenizer=_Vocab())
        gen = await eng.generate(
            GenerationRequest(prompt_ids=[1], sampling=SamplingParams(max_tokens=3))
        )
        await eng.close()
    assert gen.finish_reason == "error" and gen.token_ids in (None, [])
    assert gen.error is not None and all(w in gen.error for w in words), gen.error
    assert eng.stats["errors"] == 1


async def test_a_logprob_of_zero_and_float_rounding_above_it_are_accepted() -> None:
    reply = FakeReply(token_ids=[5, 6], logprobs=[0.0, 1e-7])
    with FakeOpenAIServer(script=[reply]) as srv:
        eng = engine(srv, token_level=True, tokenizer=_Vocab())
        gen = await eng.generate(GenerationRequest(prompt_ids=[1]))
        await eng.close()
    assert gen.error is None and gen.token_ids == [5, 6]
