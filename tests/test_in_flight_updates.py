"""In-flight weight updates on TorchEngine: a sync while requests decode lands between two steps.

The requests go on with their keys/values (computed by the old weights) and sample their next
tokens with the new weights, each token recording the version that sampled it. What is checked:
the switch happens at one step boundary, the same for every sequence decoding together; the
tokens before it are those of a run without the sync; the logprobs after it are those of a
forward of the new weights over the old weights' keys/values (atol 1e-4), and differ from a
forward of the new weights alone.
"""

from __future__ import annotations

import asyncio
import copy
import threading

import pytest
import torch
from test_torch_engine import TOKENIZER, gather, hf_logprobs, make_model, prompts

from looprl.engines.base import GenerationRequest
from looprl.engines.openai_engine import OpenAIEngine
from looprl.engines.scripted import ScriptedEngine
from looprl.engines.torch_engine import TorchEngine
from looprl.engines.vllm_engine import VLLMEngine
from looprl.types import SamplingParams

PAUSE_AT = 5  # the sync arrives during the 5th decoding step
SWITCH = PAUSE_AT + 1  # tokens 0 (prefill) .. 5 (5th decode) are the old version's


def old_kv_logprobs(
    old: torch.nn.Module, new: torch.nn.Module, prompt: list[int], tokens: list[int], switch: int
) -> torch.Tensor:
    """Logprobs of `tokens[switch:]` when the new weights continue the old weights' cache.

    The old weights computed the keys/values of the prompt and of `tokens[:switch - 1]` (the
    token sampled last before the swap is fed to the first step after it); the new weights
    compute those of every later position and the logits.
    """
    with torch.no_grad():
        past = old(torch.tensor([prompt + tokens[: switch - 1]]), use_cache=True).past_key_values
        logits = new(torch.tensor([tokens[switch - 1 : -1]]), cache=past).logits[0]
    logp = torch.log_softmax(logits.float(), dim=-1)  # (n, V)
    return logp.gather(-1, torch.tensor(tokens[switch:])[:, None])[:, 0]


class AnnouncedLock:
    """The engine's weights lock, announcing when a thread other than the worker waits for it
    (`sync_weights` does so after telling the worker to start no new step)."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock
        self.sync_waiting = threading.Event()

    def __enter__(self) -> AnnouncedLock:
        if threading.current_thread().name != "looprl-torch-engine":
            self.sync_waiting.set()
        self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def engine_of(model: torch.nn.Module) -> TorchEngine:
    return TorchEngine(
        copy.deepcopy(model), TOKENIZER, max_batch_size=4, stop_token_ids=[], device="cpu"
    )


async def test_a_sync_mid_decode_swaps_weights_between_two_steps_and_keeps_the_cache(
    monkeypatch,
) -> None:
    old, new = make_model("llama", seed=0), make_model("llama", seed=7)
    reqs = [(p, SamplingParams(max_tokens=16, seed=i)) for i, p in enumerate(prompts(3))]
    reference = engine_of(old)
    unswapped = await gather(reference, reqs)
    await reference.close()

    eng = engine_of(old)
    reached, go = threading.Event(), threading.Event()
    decode, calls = eng.backend.decode, []

    def pausing_decode(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == PAUSE_AT:  # hold this step until the sync is waiting for it
            reached.set()
            go.wait(30)
        return decode(tokens, positions)

    monkeypatch.setattr(eng.backend, "decode", pausing_decode)
    running = asyncio.ensure_future(gather(eng, reqs))
    assert await asyncio.to_thread(reached.wait, 30)
    lock = AnnouncedLock(eng.weights_lock)
    monkeypatch.setattr(eng, "weights_lock", lock)  # the paused step holds the lock itself
    syncing = asyncio.ensure_future(asyncio.to_thread(eng.sync_weights, new, version=1))
    assert await asyncio.to_thread(lock.sync_waiting.wait, 30)  # no further step may start now
    go.set()
    await syncing
    gens = await running

    for (prompt, _), g, ref in zip(reqs, gens, unswapped, strict=True):
        assert g.finish_reason == "length" and len(g.token_ids) == 16
        assert g.versions == [0] * SWITCH + [1] * (16 - SWITCH)  # one switch, the same step
        assert g.token_ids[:SWITCH] == ref.token_ids[:SWITCH]
        assert g.logprobs[:SWITCH] == ref.logprobs[:SWITCH]
        after = torch.tensor(g.logprobs[SWITCH:])
        expected = old_kv_logprobs(old, new, prompt, g.token_ids, SWITCH)
        assert torch.allclose(after, expected, atol=1e-4), (after, expected)
        recomputed = hf_logprobs(new, prompt, g.token_ids)[SWITCH:]  # new weights everywhere
        assert not torch.allclose(after, recomputed, atol=1e-2)
    # no sequence that spans the swap entered the prefix cache: its next turn prefills anew
    hits = eng.stats.prefix_hits
    turn = reqs[0][0] + gens[0].token_ids + [5]
    nxt = await eng.generate(GenerationRequest(prompt_ids=turn, sampling=reqs[0][1]))
    assert eng.stats.prefix_hits == hits and nxt.versions == [1] * 16
    await eng.close()


async def test_a_drained_sync_gives_every_token_of_a_request_one_version() -> None:
    model = make_model("llama", seed=0)
    eng = engine_of(model)
    sampling = SamplingParams(max_tokens=4, seed=1)
    first = await eng.generate(GenerationRequest(prompt_ids=prompts(1)[0], sampling=sampling))
    eng.sync_weights(make_model("llama", seed=3), version=4)
    second = await eng.generate(GenerationRequest(prompt_ids=prompts(1)[0], sampling=sampling))
    with pytest.raises(ValueError, match="lacks"):  # a refused sync moves nothing, blocks nothing
        eng.sync_weights({"nope": torch.zeros(1)}, version=9)
    third = await eng.generate(GenerationRequest(prompt_ids=prompts(1)[0], sampling=sampling))
    await eng.close()
    assert (first.versions, second.versions, third.versions) == ([0] * 4, [4] * 4, [4] * 4)
    assert eng.policy_version == 4


def test_every_engine_says_whether_it_takes_weights_in_flight() -> None:
    assert TorchEngine.in_flight_updates and VLLMEngine.in_flight_updates
    for cls in (OpenAIEngine, ScriptedEngine):
        assert cls.in_flight_updates is False
