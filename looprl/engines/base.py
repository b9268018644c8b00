"""The engine interface: sample an assistant turn as token ids and logprobs (or text, for hosted APIs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from looprl.types import Generation, Message, SamplingParams


@dataclass
class GenerationRequest:
    """One request to an engine.

    Token-level engines read `prompt_ids` (the exact context, never re-encoded) and must return
    the sampled ids with logprobs. Message-level engines (hosted chat APIs) read `messages` and
    `tools` (OpenAI function schemas) and return text. The rollout fills both when it can.
    """

    prompt_ids: list[int] | None = None
    messages: list[Message] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)


@runtime_checkable
class Engine(Protocol):
    """Anything that turns a `GenerationRequest` into a `Generation`.

    `token_level` is True when the engine consumes `prompt_ids` and returns token ids plus
    logprobs (needed for training); False for message-level engines (evaluation only).
    `generate` never raises for a failed request: it returns `finish_reason="error"`.
    """

    token_level: bool

    async def generate(self, request: GenerationRequest) -> Generation:
        """Sample one assistant turn."""
        ...

    async def close(self) -> None:
        """Release resources (threads, connections)."""
        ...
