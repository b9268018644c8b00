"""Simulated users: the other party of a `ToolEnv` conversation, scripted or played by a model.

With `ToolEnv(user=...)` an assistant turn without a tool call goes to the user instead of
ending the episode: the user's reply comes back as a `user` message, which the transcript renders
like any environment message (glue and suffix, mask 0), and `None` ends the episode. Tool turns
and user turns alternate as the policy chooses; `Limits.max_turns` bounds the whole conversation
and `Limits.timeout_s` counts the user's time with the tools'.

- `ScriptedUser(fn)`: `fn(messages, task) -> str | None`, sync or async, over the conversation so
  far (system prompt, the task's opening, assistant turns, tool results, earlier user replies).
  A plain function given as `user=` is wrapped in one.
- `ModelUser(engine, persona)` (or `ModelUser.from_model(kind, model, persona)`): a model plays
  the user with its own engine. It sees the
  conversation from its side: the persona (filled from `task.info`) as its system prompt, the
  task's user messages and its own earlier replies as its assistant turns, the policy's replies
  (their text outside tool calls) as user turns; tool calls and results are not shown to it.
  Only its reply's text enters the policy's conversation, never its tokens or logprobs. A reply
  holding `end_marker`, or an empty one, ends the episode.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from looprl.engines.base import Engine, GenerationRequest
from looprl.rendering.renderer import prompt_renderer
from looprl.types import Message, SamplingParams, Task

END_MARKER = "###DONE###"
OPENING = "(Start the conversation.)"
"""The model user's first user turn, so its own opening message follows a user turn."""

UserFunction = Callable[[list[Message], Task], str | None | Awaitable[str | None]]


@runtime_checkable
class SimulatedUser(Protocol):
    """The user of a `ToolEnv`: the next user message, or None to end the episode."""

    async def reply(self, messages: list[Message], task: Task) -> str | None:
        """Answer the conversation so far (it ends with the assistant turn to answer)."""
        ...


class ScriptedUser:
    """A user written as a function `fn(messages, task) -> str | None` (sync or async)."""

    def __init__(self, fn: UserFunction) -> None:
        self.fn = fn

    async def reply(self, messages: list[Message], task: Task) -> str | None:
        """The function's answer (awaited when it is a coroutine)."""
        out = self.fn(messages, task)
        return await out if inspect.isawaitable(out) else out


class ModelUser:
    """A user played by a model through its own engine (see the module docstring).

    Args:
        engine: the user model: any engine (`from_model` builds a server's or a local one, as a
            judge's); a token-level engine needs the model's `tokenizer`.
        persona: its system prompt, a `str.format` template over `task.info` (e.g. "You are a
            customer whose order {order_id} ..."); say in it how to end (`end_marker`).
        sampling: the user's sampling (default: greedy, 128 tokens).
        end_marker: the text by which the user ends the conversation.
    """

    def __init__(
        self,
        engine: Engine,
        persona: str,
        *,
        tokenizer: Any = None,
        sampling: SamplingParams | None = None,
        end_marker: str = END_MARKER,
    ) -> None:
        self.engine = engine
        self.persona = persona
        self.sampling = sampling or SamplingParams(max_tokens=128, temperature=0.0)
        self.end_marker = end_marker
        self.renderer = prompt_renderer(
            engine, tokenizer, "ModelUser(engine, persona, tokenizer=...)"
        )

    @classmethod
    def from_model(
        cls, kind: str, model: str, persona: str, *, base_url: str | None = None, **kwargs: Any
    ) -> ModelUser:
        """A user played by a served model (`kind="openai"`, at `base_url`) or a local one
        (`"torch"`: tiny, smollm2-135m or a model directory), built as a judge's engine is."""
        from looprl.engines.factory import side_engine

        if kind not in ("openai", "torch"):
            raise ValueError(f"user model kind must be 'openai' or 'torch', got {kind!r}")
        if kind == "openai" and not base_url:
            raise ValueError("an openai user model needs base_url (the server's /v1 URL)")
        engine, tokenizer = side_engine(kind, model, base_url, 8, 60.0)
        return cls(engine, persona, tokenizer=tokenizer, **kwargs)

    def conversation(self, messages: list[Message], task: Task) -> list[Message]:
        """The conversation as the user model sees it (roles swapped, tools left out)."""
        try:
            system = self.persona.format_map(task.info)
        except KeyError as exc:
            raise ValueError(
                f"the user persona names {{{exc.args[0]}}}, which task {task.id!r} lacks in its "
                f"info (it has {sorted(task.info)}); add it to the tasks or change the persona"
            ) from None
        out = [Message(role="system", content=system), Message(role="user", content=OPENING)]
        for m in messages:
            if m.role == "user":
                out.append(Message(role="assistant", content=m.content))
            elif m.role == "assistant" and m.content.strip():
                out.append(Message(role="user", content=m.content))
        return out

    async def reply(self, messages: list[Message], task: Task) -> str | None:
        """The user model's next message; None when it ends the conversation."""
        seen = self.conversation(messages, task)
        ids = self.renderer.prompt_ids(seen) if self.renderer is not None else None
        gen = await self.engine.generate(
            GenerationRequest(prompt_ids=ids, messages=seen, sampling=self.sampling)
        )
        if gen.finish_reason == "error":
            raise RuntimeError(f"the simulated user's engine failed: {gen.error}")
        text = gen.text.strip()
        return None if not text or self.end_marker in text else text


def as_user(user: SimulatedUser | UserFunction | None) -> SimulatedUser | None:
    """`user` as a `SimulatedUser`: itself, a function wrapped in `ScriptedUser`, or None."""
    if user is None or isinstance(user, SimulatedUser):
        return user
    if callable(user):
        return ScriptedUser(user)
    raise ValueError(
        f"user must be a function (messages, task) -> str | None or an object with "
        f"async reply(messages, task), got {type(user).__name__}"
    )
