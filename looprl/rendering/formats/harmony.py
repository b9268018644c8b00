"""gpt-oss harmony: a turn is a sequence of channel messages; calls go to `functions.NAME`.

gpt-oss's generation prompt is `<|start|>assistant`; the model then writes one or more
messages, each `HEADER<|message|>BODY` closed by an end token, the next one opened by
`<|start|>assistant`:

    <|channel|>analysis<|message|>I should add them.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1}<|call|>

or, for an answer, `...<|channel|>final<|message|>It is 3.<|return|>`. Rules of `HarmonyParser`:

- the `analysis` channel is the turn's reasoning (several analysis messages are joined by a
  blank line); the `final` channel is the answer; a `commentary` message with no recipient (a
  preamble) is answer text too, as is text in no message at all (a header the turn's token
  limit cut off before its `<|message|>` is dropped);
- a message with a recipient `to=functions.NAME` is a call, written before `<|channel|>` (as
  the template writes it) or after the channel name (as the model usually does); its body is
  the arguments, one strict JSON object; `json` or `<|constrain|>json` may follow the channel;
- a call must end with `<|call|>`; a recipient outside `functions`, a missing name, a body that
  is not strict JSON or not an object, and a call closed by anything else are malformed calls
  (`ParseError`s) that tell the model the exact form, as in every format; ids are `call_0`, ...
- decoding keeps the harmony tokens (`markers`), and the renderer reads the reasoning from this
  parser (`reads_reasoning`) instead of looking for `<think>` blocks.

A turn ends in `<|call|>` or `<|return|>` (gpt-oss's stop tokens, which the engines keep);
the chat template closes an answer with `<|return|>`, a call with `<|call|>` (`call_closing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from looprl.rendering.parser import (
    BAD_ARGUMENTS,
    BAD_NAME,
    INVALID_JSON,
    UNCLOSED_TAG,
    ParsedTurn,
    ParseError,
    call_from_object,
    strict_loads,
)
from looprl.types import ToolCall

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
NAMESPACE = "functions."
EXAMPLE = (
    '<|start|>assistant to=functions.tool_name<|channel|>commentary json<|message|>{"arg": "value"}'
    "<|call|>"
)


@dataclass
class HarmonyMessage:
    """One message of a sampled turn, split at its tokens."""

    recipient: str
    """The `to=` target (`functions.add`), "" when none."""
    channel: str
    """`analysis`, `commentary`, `final` ("" when the header names none)."""
    body: str
    """The text between `<|message|>` and the end token."""
    end: str
    """The token that closed it (`<|end|>`, `<|call|>`, `<|return|>`), "" when the text ended."""
    raw: str
    """The message exactly as written."""


class HarmonyParser:
    """Parses gpt-oss harmony turns into reasoning, answer and calls (see the module doc)."""

    markers: tuple[str, ...] = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
    """Harmony's special tokens: decoding must keep them for the parser."""
    reads_reasoning = True
    """The reasoning is a channel this parser reads, not a `<think>` block."""
    call_closing = CALL
    """What closes a tool-call turn (the template closes an answer with `<|return|>`)."""

    def parse(self, text: str) -> ParsedTurn:
        """Split a sampled turn (the text after `<|start|>assistant`) into its parts."""
        loose, messages = split_messages(text)
        reasoning: list[str] = []
        answer = [loose] if loose.strip() else []
        turn = ParsedTurn(content="")
        for message in messages:
            if message.recipient:
                result = _call(message, f"call_{len(turn.calls) + len(turn.errors)}")
                if isinstance(result, ToolCall):
                    turn.calls.append(result)
                else:
                    turn.errors.append(result)
            elif message.channel == "analysis":
                reasoning.append(message.body)
            else:
                answer.append(message.body)
        turn.content = "\n\n".join(part.strip() for part in answer).strip()
        turn.reasoning = "\n\n".join(reasoning)
        return turn

    def written_calls(self, text: str) -> list[dict[str, Any]]:
        """A turn's calls as the chat template takes them, malformed ones with their body as
        written: the template writes a tool reply only after a call, and every malformed call
        is answered by a tool message."""
        _, messages = split_messages(text)
        return [
            {"type": "function", "function": {"name": _name(m.recipient), "arguments": m.body}}
            for m in messages
            if m.recipient
        ]


def split_messages(text: str) -> tuple[str, list[HarmonyMessage]]:
    """`(text outside any message, messages)` of a sampled turn."""
    loose: list[str] = []
    messages: list[HarmonyMessage] = []
    pos = 0
    while pos < len(text):
        mark = text.find(MESSAGE, pos)
        if mark < 0:
            loose.append(text[pos:].split(START)[0])  # a header cut off is no answer text
            break
        header = text[pos:mark]
        body_at = mark + len(MESSAGE)
        end, end_at = _first_end(text, body_at)
        stop = end_at + len(end) if end else len(text)
        recipient, channel = _read_header(header)
        body = text[body_at:end_at] if end else text[body_at:]
        messages.append(HarmonyMessage(recipient, channel, body, end, text[pos:stop]))
        pos = stop
    return "".join(loose), messages


def _first_end(text: str, start: int) -> tuple[str, int]:
    """The first end token at or after `start` and where it is; `("", len(text))` when none."""
    found = [(text.find(token, start), token) for token in (END, CALL, RETURN)]
    hits = [(at, token) for at, token in found if at >= 0]
    if not hits:
        return "", len(text)
    at, token = min(hits)
    return token, at


def _read_header(header: str) -> tuple[str, str]:
    """`(recipient, channel)` of a header such as `assistant to=functions.f<|channel|>commentary json`."""
    head, _, tail = header.replace(START, " ").replace(CONSTRAIN, " ").partition(CHANNEL)
    words = head.split() + tail.split()
    recipient = next((w.removeprefix("to=") for w in words if w.startswith("to=")), "")
    channel_words = [w for w in tail.split() if not w.startswith("to=")]
    return recipient, channel_words[0] if channel_words else ""


def _name(recipient: str) -> str:
    """The tool a recipient names (`functions.add` -> `add`); other namespaces as written."""
    return recipient.removeprefix(NAMESPACE)


def _call(message: HarmonyMessage, call_id: str) -> ToolCall | ParseError:
    """One message with a recipient as a call, or what is wrong with it."""

    def error(kind: str, problem: str, name: str = "") -> ParseError:
        return ParseError(
            kind, f"{problem}, so no tool ran; write {EXAMPLE}", message.raw, call_id, name
        )

    name = _name(message.recipient)
    if not message.recipient.startswith(NAMESPACE):
        return error(BAD_NAME, f"the recipient {message.recipient!r} is not a function", name)
    if message.end != CALL:
        closed = f"closed by {message.end}" if message.end else "never closed"
        return error(UNCLOSED_TAG, f"the call to {name!r} was {closed} instead of {CALL}", name)
    try:
        arguments = strict_loads(message.body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, NaN, digit limit, nesting
        problem = str(exc)[:200] or type(exc).__name__
        return error(
            INVALID_JSON, f"the arguments of {name!r} are not strict JSON ({problem})", name
        )
    if not isinstance(arguments, dict):
        return error(BAD_ARGUMENTS, f"the arguments of {name!r} must be one JSON object", name)
    return call_from_object({"name": name, "arguments": arguments}, message.raw, call_id)
