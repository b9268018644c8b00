"""Transcripts: how a rollout keeps its context, token-exact (for training) or as messages only.

The rollout loop is the same for every engine; what differs is what it appends to. A
`TokenTranscript` keeps the flat token ids of the current training segment: the prompt
rendered once, the sampled ids exactly as sampled, and each environment turn appended through
the renderer (glue and suffix, mask 0), starting a new segment where the template rewrites
history. Each sampled token keeps the policy version that sampled it: the engine's own per-token
`Generation.versions` when it reports them, else the `policy_version` of a `TrainableEngine` as
the request was made (an engine that cannot update weights mid-request samples a whole turn on
it), else -1 (an engine of no version, e.g. scripted). A `MessageTranscript` keeps messages
only, for engines that take messages and return text (hosted chat APIs); it has no token
accounting.
"""

from __future__ import annotations

from typing import Any, Protocol

from looprl.engines.base import Engine, GenerationRequest, TrainableEngine
from looprl.rendering.renderer import Renderer
from looprl.types import EpisodeResult, Generation, Message, SamplingParams, Trajectory


class Transcript(Protocol):
    """The context of one episode, as the rollout loop sees it."""

    exact: bool
    """True when the context is token-exact (sampled ids kept, turns appended by the renderer)."""

    def room(self) -> int:
        """Tokens the context can still take before `max_context_tokens`."""
        ...

    def request(self, sampling: SamplingParams) -> GenerationRequest:
        """The engine request for the next assistant turn."""
        ...

    def add_sampled(self, gen: Generation, turn: int) -> str:
        """Record the assistant turn the engine sampled; return its text for the parser."""
        ...

    def add_env_turn(self, new: list[Message], turn: int) -> bool:
        """Append the environment's messages; False when they leave no room to generate."""
        ...


class MessageTranscript:
    """Messages only: the engine reads `messages` and `tools` and returns text."""

    exact = False

    def __init__(self, result: EpisodeResult, tools: list[dict[str, Any]], max_context: int):
        self.result = result
        self.tools = tools
        self.max_context = max_context
        result.trajectories.append(Trajectory())  # no tokens: an empty segment, as always

    def room(self) -> int:
        """Message-level engines count no tokens here: the whole context limit is left."""
        return self.max_context

    def request(self, sampling: SamplingParams) -> GenerationRequest:
        """The conversation so far, the tools, and the sampling settings."""
        return GenerationRequest(
            messages=list(self.result.messages), tools=self.tools, sampling=sampling,
            affinity=self.result.task.id,
        )  # fmt: skip

    def add_sampled(self, gen: Generation, turn: int) -> str:
        """The engine's text (its structured tool calls are added by the loop)."""
        return gen.text

    def add_env_turn(self, new: list[Message], turn: int) -> bool:
        """Messages are appended by the loop; nothing to render."""
        self.result.messages.extend(new)
        return True


class TokenTranscript:
    """Token-exact context of the current segment (see the module doc)."""

    exact = True

    def __init__(
        self,
        result: EpisodeResult,
        tools: list[dict[str, Any]],
        max_context: int,
        renderer: Renderer,
        engine: Engine | None = None,
    ) -> None:
        self.result = result
        self.tools = tools
        self.max_context = max_context
        self.renderer = renderer
        self.engine = engine
        self._version: int | None = None  # the engine's policy_version at the last request
        self.segment = Trajectory()
        self.segment.extend(renderer.prompt_ids(result.messages, tools), sampled=False, turn=0)
        result.trajectories.append(self.segment)
        self._sampled: list[int] = []

    def room(self) -> int:
        """`max_context_tokens` less the current segment's length."""
        return self.max_context - len(self.segment)

    def request(self, sampling: SamplingParams) -> GenerationRequest:
        """The exact prompt ids (and the messages, for engines that log them)."""
        engine = self.engine
        self._version = engine.policy_version if isinstance(engine, TrainableEngine) else None
        return GenerationRequest(
            prompt_ids=list(self.segment.token_ids),
            messages=list(self.result.messages),
            tools=self.tools,
            sampling=sampling,
            affinity=self.result.task.id,
        )

    def add_sampled(self, gen: Generation, turn: int) -> str:
        """Append the sampled ids, logprobs and versions (mask 1); decode them for the parser."""
        asked = -1 if self._version is None else self._version
        versions = gen.versions or [asked] * len(gen.token_ids)
        self.segment.extend(
            gen.token_ids, sampled=True, turn=turn, logprobs=gen.logprobs, versions=versions
        )
        self._sampled = gen.token_ids
        return self.renderer.decode(gen.token_ids)

    def add_env_turn(self, new: list[Message], turn: int) -> bool:
        """Glue + rendered suffix (mask 0), or a new segment where the template broke the prefix.

        A turn that would not leave room to generate within `max_context_tokens` is not
        appended (the messages are kept) and False is returned.
        """
        before = list(self.result.messages)
        self.result.messages.extend(new)
        ext = self.renderer.extend(before, self.result.messages, self._sampled, self.tools)
        if not ext.ok:
            self.segment = Trajectory()
            self.segment.extend(ext.full_ids, sampled=False, turn=turn)
            self.result.trajectories.append(self.segment)
            return True
        new_ids = ext.glue_ids + ext.suffix_ids
        if len(self.segment) + len(new_ids) >= self.max_context:
            return False
        self.segment.extend(new_ids, sampled=False, turn=turn)
        return True
