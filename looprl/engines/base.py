"""The engine interface: sample an assistant turn as token ids and logprobs (or text, for hosted APIs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from looprl.types import Generation, Message, SamplingParams

if TYPE_CHECKING:
    import torch


@dataclass
class GenerationRequest:
    """One request to an engine.

    Token-level engines read `prompt_ids` (the exact context, never re-encoded) and must return
    the sampled ids with logprobs. Message-level engines (hosted chat APIs) read `messages` and
    `tools` (OpenAI function schemas) and return text. The rollout fills both when it can.
    `affinity` (the task id) lets an engine with several servers keep a group on one server,
    for its prefix cache.
    """

    prompt_ids: list[int] | None = None
    """The exact context as token ids (token-level engines; None otherwise)."""
    messages: list[Message] = field(default_factory=list)
    """The conversation so far (what a scripted policy or a chat API reads)."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """OpenAI function schemas of the environment's tools."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """How to sample this turn."""
    affinity: str = ""
    """The task id, so an engine with several servers keeps a group on one."""


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


@runtime_checkable
class TrainableEngine(Engine, Protocol):
    """An engine the trainer drives: it samples from the policy being trained.

    `policy_version` is the optimizer step whose weights the engine samples from (0 before the
    first update). After each step the trainer calls `sync_weights` with the new weights: a
    mapping of parameter name to tensor (adapters merged in), or None when the engine samples
    from the trainer's own tensors, which the optimizer already changed in place. The trainer
    never needs to know which engine it drives. An engine that hot-loads LoRA adapters is an
    `AdapterEngine` as well.

    `in_flight_updates` says whether `sync_weights` (and `load_adapter`) may be called while
    requests are in flight: tokens sampled after the call returns carry the new version, in
    `Generation.versions`, and the requests go on. False: the trainer drains the engine first.
    """

    policy_version: int
    in_flight_updates: bool

    def sync_weights(
        self, weights: Mapping[str, torch.Tensor] | None, *, version: int | None = None
    ) -> None:
        """Sample from `weights` (None: the shared tensors) from now on, as policy `version`."""
        ...


@runtime_checkable
class AdapterEngine(TrainableEngine, Protocol):
    """A trainable engine that takes a LoRA adapter after each step instead of full weights."""

    takes_adapters: bool
    """True when the engine was started to serve adapters (else it takes full weights)."""

    def load_adapter(self, adapter_dir: Path, *, version: int) -> None:
        """Sample with the PEFT adapter saved in `adapter_dir` from now on, as policy `version`."""
        ...
