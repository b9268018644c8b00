"""The environment author's kit: what rubrics and task generators of every environment need.

- `final_reply(episode)`, `final_raw(episode)`: the last assistant message, as parsed text or as
  sampled text; `final_answer_text(episode)`: where a rubric reads the final answer (the parsed
  text without reasoning blocks), `answer_text(message)` the same for any assistant message;
  `final_reasoning(episode)`: the last turn's reasoning (`Message.reasoning_content`);
- `model_messages(episode)`: what came after the task's prompt (a hint is part of the prompt);
- `tool_calls(episode, name)`: the calls the model made; `shown_outcomes(episode)`: how each call
  whose result the model saw went (`ToolOutcome`: error kind, the tool's own status);
- `used_tool`, `tool_call_validity`: the tool-use metrics, ready to put in a `Rubric`;
- `split_of(key)`: a stable train/eval split by a hash of a task's text.

Tools report through `looprl.tools`: raise `ToolError(message, kind=..., infra=...)` to fail a
call with a kind of your own, return `ToolReply(content, status=...)` to record a status.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from looprl.tools.executor import ERROR_KINDS, MCP_ERROR
from looprl.types import EpisodeResult, Message, ToolCall, ToolOutcome

EVAL_BUCKETS = 5  # one hash bucket in five is held out for evaluation
_REASONING = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)


def model_messages(episode: EpisodeResult) -> list[Message]:
    """The episode's messages after its task's prompt: the model's turns and the replies to
    them. A hint (`looprl.envs.hints`) is part of the prompt, so a hinted tool call is not here."""
    prompt = episode.task.prompt
    if episode.messages[: len(prompt)] == prompt:
        return episode.messages[len(prompt) :]
    return episode.messages  # a hand-made episode that lists the model's messages alone


def _last_assistant(episode: EpisodeResult) -> Message | None:
    return next((m for m in reversed(model_messages(episode)) if m.role == "assistant"), None)


def final_reply(episode: EpisodeResult) -> str:
    """Content of the last assistant message (the text outside tool calls; "" when none)."""
    last = _last_assistant(episode)
    return last.content if last is not None else ""


def final_raw(episode: EpisodeResult) -> str:
    """The exact text the model sampled in its last turn (its content when no raw text was kept)."""
    last = _last_assistant(episode)
    return (last.raw or last.content) if last is not None else ""


def answer_text(message: Message) -> str:
    """An assistant message as a rubric should read an answer from it: the text outside tool
    calls, without `<think>...</think>` blocks (an unclosed `<think>` runs to the end).

    An answer written in reasoning or inside a tool call's arguments is not an answer: `looprl
    probe` checks that rubrics read only this.
    """
    return _REASONING.sub("", message.content).strip()


def final_answer_text(episode: EpisodeResult) -> str:
    """`answer_text` of the last assistant message ("" when none): read final answers from this."""
    last = _last_assistant(episode)
    return answer_text(last) if last is not None else ""


def final_reasoning(episode: EpisodeResult) -> str:
    """The reasoning block of the last assistant message ("" when none): for rubrics that grade
    the reasoning too; answers are read from `final_answer_text`, which never includes it."""
    last = _last_assistant(episode)
    return last.reasoning_content if last is not None else ""


def tool_calls(episode: EpisodeResult, name: str | None = None) -> list[ToolCall]:
    """The well-formed calls the model made, in order (only those of tool `name` when given);
    a hinted call, made for the model in its prompt, is not one of them."""
    return [
        call
        for m in model_messages(episode)
        if m.role == "assistant"
        for call in m.tool_calls
        if name is None or call.name == name
    ]


def shown_outcomes(episode: EpisodeResult) -> list[ToolOutcome]:
    """How each call whose result is in `episode.messages` went, in order.

    `episode.tool_outcomes` holds every call that ran; a turn cut by `max_turns` ran its calls
    but its tool messages were never added, so its outcomes are left out here. Empty for
    episodes recorded before outcomes were kept.
    """
    return episode.tool_outcomes[: sum(m.role == "tool" for m in model_messages(episode))]


def _failed_calls(episode: EpisodeResult) -> int:
    """Calls that failed with one of the executor's error kinds (malformed ones included) or
    `mcp_error` (an MCP server's error result: the tool failed on the call, as an exception is)."""
    return sum(episode.tool_errors.get(kind, 0) for kind in (*ERROR_KINDS, MCP_ERROR))


def used_tool(episode: EpisodeResult) -> float:
    """1.0 when the episode made at least one valid tool call (metric)."""
    return float(episode.num_tool_calls > _failed_calls(episode))  # counts are >= 0


def tool_call_validity(episode: EpisodeResult) -> float:
    """Fraction of tool calls that ran without error (1.0 when there were none) (metric)."""
    if episode.num_tool_calls == 0:
        return 1.0
    return 1.0 - _failed_calls(episode) / episode.num_tool_calls


def split_of(key: str, eval_buckets: int = EVAL_BUCKETS) -> Literal["train", "eval"]:
    """`eval` when a hash of `key` falls in the first of `eval_buckets` buckets, else `train`.

    Hash the text that must never appear in both splits (the question, the expression).
    """
    bucket = int(hashlib.sha256(key.encode()).hexdigest(), 16) % eval_buckets
    return "eval" if bucket == 0 else "train"
