"""`VLLMTokenClient` against a scripted server: per-token versions, resubmission after an abort.

vLLM's `weight_versions` spans become one policy version per token; an aborted request (an
adapter sync) is sent again with its tokens so far appended to the prompt and the rest of its
budget; an adapter's tokens carry the adapter's version; replies the trainer cannot use are
errors that say why. The real server is exercised in tests/test_vllm_inflight.py.
"""

from __future__ import annotations

import asyncio

import pytest

from looprl.engines.base import GenerationRequest
from looprl.engines.openai_engine import RequestFailed
from looprl.engines.vllm_client import VLLMTokenClient, token_versions
from looprl.testing.fake_openai import FakeOpenAIServer, FakeReply
from looprl.types import SamplingParams

PROMPT = [1, 5, 9]


def request(max_tokens: int = 8) -> GenerationRequest:
    """A seeded token-level request for PROMPT."""
    return GenerationRequest(
        prompt_ids=PROMPT, sampling=SamplingParams(max_tokens=max_tokens, seed=3)
    )


def spans(*parts: tuple[str, int, int]) -> list[dict]:
    """vLLM's `weight_versions` entries."""
    return [{"version": v, "start": a, "end": b} for v, a, b in parts]


def test_weight_version_spans_become_one_version_per_token() -> None:
    assert token_versions(spans(("3", 0, 2), ("4", 2, 5)), 5) == [3, 3, 4, 4, 4]
    assert token_versions(spans(("default", 0, 2), ("4", 2, 5)), 5) == []  # not labelled by us
    assert token_versions(None, 5) == []
    with pytest.raises(RequestFailed, match="weight_versions cover 2 of 5 sampled tokens"):
        token_versions(spans(("3", 0, 2)), 5)


def test_an_aborted_request_is_sent_again_with_its_tokens_as_prompt(tiny_tokenizer) -> None:
    labelled = {"token_ids": [7, 8], "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]},
                "weight_versions": spans(("0", 0, 2)), "finish_reason": "abort"}  # fmt: skip
    script = [FakeReply(body={"choices": [labelled]}), FakeReply(token_ids=[9], logprobs=[-0.3])]
    with FakeOpenAIServer(script=script) as srv:
        client = VLLMTokenClient(
            srv.base_url.removesuffix("/v1"), "policy", tokenizer=tiny_tokenizer
        )
        gen = asyncio.run(client.generate(request(max_tokens=8)))
        first, second = [r.json for r in srv.requests]
    assert (gen.token_ids, gen.logprobs, gen.finish_reason) == (
        [7, 8, 9],
        [-0.1, -0.2, -0.3],
        "stop",
    )
    assert gen.versions == []  # the resubmission had no labels: unknown for the whole turn
    assert second["token_ids"] == PROMPT + [7, 8]
    assert (first["sampling_params"]["max_tokens"], second["sampling_params"]["max_tokens"]) == (
        8,
        6,
    )
    assert second["sampling_params"]["seed"] == 3 and second["sampling_params"]["logprobs"] == 0


def test_an_adapters_tokens_carry_its_version(tiny_tokenizer) -> None:
    with FakeOpenAIServer(script=[FakeReply(token_ids=[4, 5], logprobs=[-1.0, -1.0])]) as srv:
        client = VLLMTokenClient(
            srv.base_url.removesuffix("/v1"), "policy", tokenizer=tiny_tokenizer
        )
        client.model, client.adapter_version = "policy-v6", 6
        gen = asyncio.run(client.generate(request()))
        (sent,) = [r.json for r in srv.requests]
    assert gen.versions == [6, 6] and sent["model"] == "policy-v6"
    assert gen.text == tiny_tokenizer.decode([4, 5])


def test_a_reply_without_a_logprob_per_token_is_an_error(tiny_tokenizer) -> None:
    short = {"token_ids": [7, 8], "logprobs": {"content": [{"logprob": -0.1}]}}
    with FakeOpenAIServer(script=[FakeReply(body={"choices": [short]})]) as srv:
        client = VLLMTokenClient(
            srv.base_url.removesuffix("/v1"), "policy", tokenizer=tiny_tokenizer
        )
        gen = asyncio.run(client.generate(request()))
    assert gen.finish_reason == "error"
    assert gen.error == "vLLM: 1 logprobs for 2 sampled tokens"


def test_a_server_that_fails_during_a_pause_leaves_the_others_resumed() -> None:
    from looprl.engines.vllm_server import VLLMServerError, free_port, paused

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with FakeOpenAIServer() as srv:
        live = srv.base_url.removesuffix("/v1")
        with pytest.raises(VLLMServerError, match=f"POST {dead}/"), paused([live, dead], version=4):
            pass
        sent = [(r.path, r.json) for r in srv.requests]
    assert [path for path, _ in sent] == [
        "/pause", "/update_weight_version", "/reset_prefix_cache", "/resume",
    ]  # fmt: skip
    assert sent[1][1] == {"new_version": "4"}
