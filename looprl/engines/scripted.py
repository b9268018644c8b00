"""A scripted engine that replies from a fixed script: for tests and framework benchmarks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from looprl.engines.base import GenerationRequest
from looprl.types import Generation

Script = list[str] | Callable[[GenerationRequest], str]


class ScriptedEngine:
    """Replies with scripted texts, as token ids when given a tokenizer.

    `script` is a list of replies (the i-th assistant turn of an episode gets reply i, counted
    from the request's messages) or a function of the request. With a tokenizer the engine is
    token-level: a reply is encoded once, the end-of-turn token is appended, and each token gets
    the fixed `logprob`, exactly as a sampler would return them.
    """

    in_flight_updates = False  # it takes no weight updates at all

    def __init__(
        self,
        script: Script,
        tokenizer: Any | None = None,
        *,
        eos_token: str | None = "<|im_end|>",
        logprob: float = -0.5,
        delay: float = 0.0,
    ) -> None:
        self.script = script
        self.tokenizer = tokenizer
        self.token_level = tokenizer is not None
        self.eos_ids = (
            tokenizer.encode(eos_token, add_special_tokens=False) if tokenizer and eos_token else []
        )
        self.logprob = logprob
        self.delay = delay
        self.calls = 0

    def _reply(self, request: GenerationRequest) -> str:
        if callable(self.script):
            return self.script(request)
        turn = sum(1 for m in request.messages if m.role == "assistant")
        if turn >= len(self.script):
            raise IndexError(
                f"script has {len(self.script)} replies, turn {turn} asked for another"
            )
        return self.script[turn]

    async def generate(self, request: GenerationRequest) -> Generation:
        """Return the scripted reply for this request (an `error` generation if the script raises)."""
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        try:
            text = self._reply(request)
        except Exception as exc:
            return Generation(text="", finish_reason="error", error=f"{type(exc).__name__}: {exc}")
        if self.tokenizer is None:
            return Generation(text=text)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        limit = request.sampling.max_tokens
        if len(ids) + len(self.eos_ids) > limit:
            ids = ids[:limit]
            return Generation(
                text=text, token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason="length"
            )
        ids += self.eos_ids
        return Generation(text=text, token_ids=ids, logprobs=[self.logprob] * len(ids))

    async def close(self) -> None:
        """Nothing to release."""
