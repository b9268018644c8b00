"""`looprl eval -b URL -m MODEL`: token counts from the server's `usage`, and the preflight that
finds a wrong model name, a refused key and a dead server before any episode runs."""

from __future__ import annotations

import asyncio
import json

import pytest

from looprl.cli.main import main
from looprl.engines.base import GenerationRequest
from looprl.engines.openai_engine import OpenAIEngine
from looprl.testing.fake_openai import FakeOpenAIServer, FakeReply
from looprl.types import Message

ANSWER = "The answer is 1."


def _eval_args(url: str, model: str, out: object, n: int = 3) -> list[str]:
    return [
        "eval",
        "calculator",
        "-b",
        url,
        "-m",
        model,
        "-n",
        str(n),
        "-r",
        "1",
        "--output",
        str(out),
    ]


def _chat_requests(srv: FakeOpenAIServer) -> list[dict]:
    return [r.json for r in srv.requests if r.path == "/v1/chat/completions"]


def _one_error_line(err: str) -> str:
    """The single stderr line of a refused command (no traceback)."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and " — " in lines[0], err
    return lines[0]


def test_a_server_eval_reports_the_tokens_its_usage_counted(tmp_path) -> None:
    out = tmp_path / "ev"
    with FakeOpenAIServer(script=[ANSWER]) as srv:
        assert main(_eval_args(srv.base_url, "fake-model", out)) == 0
        chats = _chat_requests(srv)
    summary = json.loads((out / "metadata.json").read_text())["summary"]
    # the fake counts words: 4 per reply ("The answer is 1."); one turn per episode here
    assert summary["episodes"] == 3 and len(chats) == 3
    assert summary["generated_tokens"] == 3 * len(ANSWER.split())
    assert summary["tokens_per_second"] > 0
    prompt_words = sum(len(m["content"].split()) for c in chats for m in c["messages"])
    assert summary["prompt_tokens"] == prompt_words > 0


def test_the_engine_keeps_usage_and_ignores_a_missing_or_bad_one() -> None:
    request = GenerationRequest(messages=[Message(role="user", content="one two three")])
    bodies = [
        None,  # the fake's own reply: usage counted in words
        {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]},  # no usage
        {
            "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": None, "completion_tokens": -3},
        },
    ]

    async def run(srv: FakeOpenAIServer) -> list[tuple[int | None, int | None]]:
        engine = OpenAIEngine(srv.base_url, "fake-model")
        gens = [await engine.generate(request) for _ in bodies]
        await engine.close()
        return [(g.prompt_tokens, g.completion_tokens) for g in gens]

    replies = [FakeReply(text="four words right here", body=b) for b in bodies]
    with FakeOpenAIServer(script=lambda req: replies.pop(0)) as srv:
        assert asyncio.run(run(srv)) == [(3, 4), (None, None), (None, None)]


def test_a_model_the_server_does_not_serve_is_refused_before_any_episode(tmp_path, capsys) -> None:
    out = tmp_path / "ev"
    with FakeOpenAIServer(script=[ANSWER], models=["Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B"]) as srv:
        url = srv.base_url
        assert main(_eval_args(url, "qwen3-8b", out)) == 2
        chats = _chat_requests(srv)
    line = _one_error_line(capsys.readouterr().err)
    assert f"the server at {url} serves Qwen/Qwen3-8B, Qwen/Qwen3-0.6B, not qwen3-8b" in line
    assert line.endswith("pass -m Qwen/Qwen3-8B")
    assert chats == [] and not out.exists()


def test_a_server_without_a_model_list_is_not_checked(tmp_path) -> None:
    out = tmp_path / "ev"
    with FakeOpenAIServer(script=[ANSWER], list_models=False) as srv:
        assert main(_eval_args(srv.base_url, "any-name", out, n=1)) == 0
        assert [r.path for r in srv.requests][:2] == ["/v1/models", "/v1/chat/completions"]
    assert json.loads((out / "metadata.json").read_text())["status"] == "finished"


@pytest.mark.parametrize("key_var", [None, "MY_WRONG_KEY"])
def test_a_refused_key_is_one_line_naming_the_flag(tmp_path, capsys, monkeypatch, key_var) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("MY_WRONG_KEY", "sk-wrong")
    out = tmp_path / "ev"
    with FakeOpenAIServer(script=[ANSWER], api_key="sk-right") as srv:
        args = _eval_args(srv.base_url, "fake-model", out)
        assert main(args + (["--api-key-var", key_var] if key_var else [])) == 2
        chats = _chat_requests(srv)
    line = _one_error_line(capsys.readouterr().err)
    assert "refused the API key (HTTP 401" in line and "--api-key-var NAME" in line
    assert ("sent no key" in line) == (key_var is None)
    assert chats == [] and not out.exists()


def test_the_right_key_passes_the_preflight(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-right")
    with FakeOpenAIServer(script=[ANSWER], api_key="sk-right") as srv:
        args = _eval_args(srv.base_url, "fake-model", tmp_path / "ev", n=1)
        assert main([*args, "--api-key-var", "MY_KEY"]) == 0


def test_a_dead_server_is_one_line_with_the_url_and_the_fix(tmp_path, capsys) -> None:
    srv = FakeOpenAIServer().start()
    url = srv.base_url
    srv.stop()  # nothing listens there now
    out = tmp_path / "ev"
    assert main(_eval_args(url, "fake-model", out)) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"no server answers at {url}" in line and "--base-url" in line
    assert not out.exists()
