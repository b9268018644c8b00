"""Hints: help an environment may give a training task, which the curriculum fades as the policy learns.

An environment gives a hint through `Environment.hint(task, rng) -> Hint | None` (a `hint=`
function given to its constructor, or an override). A hint is messages added to the end of the
task's prompt, so they are rendered as prompt tokens (mask 0: the policy is never trained on
them) and sit in `episode.messages` before the model's first turn:

- `note_hint(text)`: a user message (wordle's possible words, a fact the question needs);
- `tool_call_hint(name, arguments, result)`: a first tool call already made for the model, the
  assistant message that asked for it and the tool's reply;
- `then_note(hint, template)`: another hint followed by a note (for the bootstrap only).

The rubric scores only what the model did itself: `looprl.kit.model_messages` skips the prompt,
hint included, so `tool_calls`, `used_tool` and answers read from the final turn never credit a
hinted call. The trainer's curriculum (`looprl.trainer.curriculum`) decides when to hint;
evaluation never does (`looprl eval` and the trainer's held-out evaluation take tasks from
`Environment.get_tasks`, which gives no hint).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from looprl.types import Message, Task, ToolCall

HINT_CALL_ID = "hint_0"  # the id of a hinted tool call and of the tool message answering it


@dataclass(frozen=True)
class Hint:
    """Help for one training task: messages appended to its prompt, and what kind of help."""

    messages: tuple[Message, ...]
    """Appended after the prompt, before the model's first turn (rendered as prompt, mask 0)."""
    kind: str
    """A short name for logs and the viewer: `note`, `tool_call`."""


HintFunction = Callable[[Task, random.Random], Hint | None]
"""An environment's hint: `(task, rng) -> Hint | None` (None: no hint for this task)."""


def note_hint(text: str) -> Hint:
    """A hint given as a user message after the prompt."""
    return Hint((Message(role="user", content=text),), "note")


def tool_call_hint(name: str, arguments: dict[str, Any], result: str) -> Hint:
    """A first tool call already made for the model: the call and the tool's reply to it."""
    call = ToolCall(name=name, arguments=arguments, id=HINT_CALL_ID)
    return Hint(
        (
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", content=result, tool_call_id=HINT_CALL_ID, name=name),
        ),
        "tool_call",
    )


def then_note(hint: HintFunction, template: str) -> HintFunction:
    """A hint function giving `hint`'s messages followed by a note, `template` formatted with
    the task's `answer=` (e.g. a call made for the model, then how to state its result); kind
    `<kind>+note`. For `looprl bootstrap`'s rationalisation, which takes the trailing note out
    of what the model is fine-tuned on (the call stays, as the model's own turn)."""

    def hinted(task: Task, rng: random.Random) -> Hint | None:
        first = hint(task, rng)
        if first is None or task.answer is None:
            return first
        note = Message(role="user", content=template.format(answer=task.answer))
        return Hint((*first.messages, note), f"{first.kind}+note")

    return hinted


def ends_with_note(task: Task) -> bool:
    """Whether the task's prompt ends with a hint's note (kind `note` or `<kind>+note`)."""
    return str(task.info.get("hint", "")).endswith("note")


def answer_note(template: str) -> HintFunction:
    """A hint function giving the task's own answer in a note, `template` formatted with
    `answer=` (None for a task without one).

    For STaR's rationalisation in `looprl bootstrap` (`bootstrap.rationalize`), where the note
    is dropped from what the model is fine-tuned on. Never as an RL hint: copying the answer
    would be rewarded.
    """

    def hint(task: Task, rng: random.Random) -> Hint | None:
        return None if task.answer is None else note_hint(template.format(answer=task.answer))

    return hint


def with_hint(task: Task, hint: Hint) -> Task:
    """A copy of `task` whose prompt ends with the hint's messages and whose `info["hint"]`
    names its kind (the task itself is left as it was)."""
    return dataclasses.replace(
        task, prompt=[*task.prompt, *hint.messages], info={**task.info, "hint": hint.kind}
    )


def is_hinted(task: Task) -> bool:
    """Whether the task's prompt carries a hint (`with_hint` made it)."""
    return "hint" in task.info
