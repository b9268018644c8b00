"""Tool-call parsing: split an assistant turn into its text and its tool calls (pluggable formats).

This module holds the Hermes parser and what every format shares (`ParsedTurn`, `ParseError`
and its kinds, `call_from_json`, `strict_loads`); the other formats (Llama-3 JSON, Mistral,
Qwen3-Coder XML) and the table of names are in `looprl.rendering.formats`.

The default format (Hermes / Qwen / many chat templates) wraps each call in a tag:

    <tool_call>
    {"name": "add", "arguments": {"a": 1, "b": 2}}
    </tool_call>

Rules of `HermesParser`, decided here once:

- whitespace and newlines around the JSON inside a block are allowed; nothing else is (no code
  fences, no trailing text): the model is trained on the format, so it is held to it;
- `arguments` may be a JSON object or a string holding one (some models double-encode);
  `parameters` is accepted as an alias (Llama-3-style calls), but giving both is an error;
  a missing `arguments` means `{}`; other keys (e.g. `"id"`) are ignored;
- a `<tool_call>` with no closing tag before the next `<tool_call>` or the end of the text (the
  turn hit its token limit, or a stop string ended it early) is a malformed, unclosed call;
  a stray `</tool_call>` with no opening tag stays in the text;
- every block, well-formed or not, gets the next id `call_0`, `call_1`, ... in order of
  appearance, so each one is answered with a tool message;
- a near-miss tag outside the blocks (`<TOOL_CALL>`, `< tool_call >`, `<tool-call>`, ...) is a
  malformed call of kind `misspelled_tag`, not a final answer: the model is told the exact tag;
- the JSON must be strict and its strings valid Unicode: NaN, Infinity, numbers too large for a
  float, lone surrogate escapes, integers past Python's digit limit and nesting deeper than
  `MAX_ARGUMENT_DEPTH` are each a malformed call with a message, never an exception.

Malformed blocks become `ParseError`s whose `kind` says precisely what was wrong; the tool
executor answers every one of them with a tool message of kind `malformed_json`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from looprl.types import ToolCall

INVALID_JSON = "invalid_json"
NOT_OBJECT = "not_object"
MISSING_NAME = "missing_name"
BAD_NAME = "bad_name"
BAD_ARGUMENTS = "bad_arguments"
UNCLOSED_TAG = "unclosed_tag"
MISSPELLED_TAG = "misspelled_tag"
PARSE_ERROR_KINDS = (
    INVALID_JSON,
    NOT_OBJECT,
    MISSING_NAME,
    BAD_NAME,
    BAD_ARGUMENTS,
    UNCLOSED_TAG,
    MISSPELLED_TAG,
)
MAX_ARGUMENT_DEPTH = 32
"""Deepest nesting of arrays and objects accepted in a call; no tool signature needs more."""

_EXAMPLE = '{"name": "tool_name", "arguments": {"arg": "value"}}'


@dataclass
class ParseError:
    """A tool-call block that could not be parsed.

    `kind` is one of `PARSE_ERROR_KINDS`; `message` says exactly what is wrong (it is shown to the
    model); `raw` is the exact block text; `id` is the call id the block was given; `name` is the
    tool name when it could be read (else empty).
    """

    kind: str
    """One of `PARSE_ERROR_KINDS`."""
    message: str
    """What is wrong, shown to the model."""
    raw: str
    """The exact block text."""
    id: str = ""
    """The call id the block was given."""
    name: str = ""
    """The tool name when it could be read (else "")."""


@dataclass
class ParsedTurn:
    """An assistant turn split into its text (outside tool-call blocks, stripped), calls and errors."""

    content: str
    """The text outside tool-call blocks, stripped."""
    calls: list[ToolCall] = field(default_factory=list)
    """The well-formed calls, in order."""
    errors: list[ParseError] = field(default_factory=list)
    """The blocks that could not be parsed."""
    reasoning: str = ""
    """The turn's leading reasoning block (`<think>...</think>`), markers and edge newlines cut;
    for harmony, its `analysis` channel."""

    def ordered(self) -> list[ToolCall | ParseError]:
        """Calls and errors together, in the order the model wrote them (by `call_N` id)."""
        items: list[ToolCall | ParseError] = [*self.calls, *self.errors]
        return sorted(items, key=lambda item: _id_index(item.id, len(items)))


def _id_index(call_id: str, fallback: int) -> int:
    """The N of `call_N` (or `callNNNNN`, Mistral's 9-character ids); other ids sort last."""
    number = call_id.removeprefix("call").removeprefix("_")
    return int(number) if call_id.startswith("call") and number.isdigit() else fallback


@runtime_checkable
class ToolCallParser(Protocol):
    """Anything that splits assistant text into content, tool calls and parse errors."""

    def parse(self, text: str) -> ParsedTurn:
        """Parse one assistant turn."""
        ...


class HermesParser:
    """Parses `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (see module doc)."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"
    example = f"<tool_call>{_EXAMPLE}</tool_call>"
    """One well-formed call, quoted in the messages about unclosed and misspelled tags."""
    markers: tuple[str, ...] = ("<tool_call>", "</tool_call>")
    """Tokens the parser must see, kept when sampled ids are decoded (some tokenizers make them
    special tokens, which decoding would otherwise drop)."""

    def parse(self, text: str) -> ParsedTurn:
        """Split `text` into content (text outside blocks), calls and errors, ids in order."""
        content_parts: list[str] = []
        calls: list[ToolCall] = []
        errors: list[ParseError] = []
        pos = 0
        index = 0
        while True:
            start = text.find(self.open_tag, pos)
            if start < 0:
                content_parts.append(text[pos:])
                break
            content_parts.append(text[pos:start])
            body_start = start + len(self.open_tag)
            end = text.find(self.close_tag, body_start)
            next_open = text.find(self.open_tag, body_start)
            call_id = f"call_{index}"
            index += 1
            if end < 0 or 0 <= next_open < end:
                stop = next_open if next_open >= 0 else len(text)
                raw = text[start:stop]
                message = _unclosed_message(self.example)
                errors.append(ParseError(UNCLOSED_TAG, message, raw, call_id))
                pos = stop
                continue
            raw = text[start : end + len(self.close_tag)]
            result = self.parse_body(text[body_start:end], raw, call_id)
            if isinstance(result, ToolCall):
                calls.append(result)
            else:
                errors.append(result)
            pos = end + len(self.close_tag)
        for match in _near_miss_tags(content_parts, self.open_tag, self.close_tag):
            errors.append(
                ParseError(
                    MISSPELLED_TAG, _misspelled_message(match, self.example), match, f"call_{index}"
                )
            )
            index += 1
        return ParsedTurn(content="".join(content_parts).strip(), calls=calls, errors=errors)

    def parse_body(self, body: str, raw: str, call_id: str) -> ToolCall | ParseError:
        """One closed block's body: a JSON object with `name` and `arguments`."""
        return call_from_json(body, raw, call_id)


_NEAR_MISS = re.compile(r"<\s*/?\s*tool[\s_\-]?call\s*/?\s*>", re.IGNORECASE)


def _near_miss_tags(parts: list[str], open_tag: str, close_tag: str) -> list[str]:
    """Tags outside the blocks that look like a tool-call tag but are not exactly one.

    Exact tags left in the text (a stray closing tag) are not near misses. One report per
    spelling: `<TOOL_CALL>` and `</TOOL_CALL>` are one mistake, reported by the first seen.
    """
    seen: dict[str, str] = {}
    for part in parts:
        for match in _NEAR_MISS.findall(part):
            if match not in (open_tag, close_tag):
                seen.setdefault(match.replace("/", ""), match)
    return list(seen.values())


def _misspelled_message(tag: str, example: str) -> str:
    return (
        f"{tag!r} is not a tool-call tag, so no tool ran; tags are exact and lower-case: "
        f"write {example}"
    )


def _unclosed_message(example: str) -> str:
    return (
        "the <tool_call> block was never closed with </tool_call> (the turn ended or a new "
        f"<tool_call> began first); write each call as {example}"
    )


def call_from_json(
    body: str, raw: str, call_id: str, *, tag: str = "<tool_call>", example: str = _EXAMPLE
) -> ToolCall | ParseError:
    """Parse one call's JSON object into a call, or say exactly what is wrong.

    Shared by every JSON format: `tag` names where the JSON was (`<tool_call>`, `[TOOL_CALLS]`)
    and `example` is the object the format expects, both quoted in the messages.
    """

    def error(kind: str, message: str, name: str = "") -> ParseError:
        return ParseError(kind, message, raw, call_id, name)

    if not body.strip():
        return error(
            INVALID_JSON, f"the {tag} block is empty; put a JSON object like {example} inside it"
        )
    try:
        obj = strict_loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, NaN, digit limit, nesting
        return error(
            INVALID_JSON,
            f"invalid JSON in {tag}: {_short(exc)}; expected an object like {example}",
        )
    if not isinstance(obj, dict):
        return error(
            NOT_OBJECT,
            f"the tool call must be a JSON object like {example}, got {_json_type(obj)}",
        )
    return call_from_object(obj, raw, call_id, example=example)


def call_from_object(
    obj: dict[str, Any], raw: str, call_id: str, *, example: str = _EXAMPLE
) -> ToolCall | ParseError:
    """A call from a decoded JSON object with `name` and `arguments` (alias `parameters`)."""

    def error(kind: str, message: str, name: str = "") -> ParseError:
        return ParseError(kind, message, raw, call_id, name)

    if "name" not in obj:
        return error(
            MISSING_NAME, f'the tool call has no "name" key; expected an object like {example}'
        )
    name = obj["name"]
    if not isinstance(name, str) or not name.strip():
        shown = "an empty string" if isinstance(name, str) else _json_type(name)
        return error(BAD_NAME, f'"name" must be a non-empty string naming a tool, got {shown}')
    if "arguments" in obj and "parameters" in obj:
        return error(
            BAD_ARGUMENTS,
            'give the arguments once, under "arguments" (not also "parameters")',
            name,
        )
    key = "parameters" if "parameters" in obj else "arguments"
    args: Any = obj.get(key, {})
    if isinstance(args, str):
        try:
            args = strict_loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as exc:
            return error(
                BAD_ARGUMENTS,
                f'"{key}" is a string but not valid JSON: {_short(exc)}; pass a JSON object',
                name,
            )
    if not isinstance(args, dict):
        return error(
            BAD_ARGUMENTS,
            f'"{key}" must be a JSON object of argument names to values, got {_json_type(args)}',
            name,
        )
    return ToolCall(name=name, arguments=args, id=call_id, raw=raw)


def structured_call(call: ToolCall) -> ToolCall | ParseError:
    """A call an engine returned as data (OpenAI `tool_calls`), checked as a text call is.

    An engine keeps arguments that are not a JSON object verbatim in `raw` (with `{}` as
    `arguments`); such a call becomes the `ParseError` a text call with those arguments gets
    (the JSON parser's message included), so the tool never runs with its defaults.
    """
    if not call.raw:
        return call
    return call_from_object({"name": call.name, "arguments": call.raw}, call.raw, call.id)


def strict_loads(text: str) -> Any:
    """Parse tool-call JSON that a tool may safely receive and a results file may safely hold.

    Raises ValueError (with a message for the model) for NaN/Infinity, numbers that overflow a
    float, lone surrogates, too-deep nesting and integers past the digit limit; RecursionError
    only escapes `json` itself on pathological input, and the caller catches it too.
    """
    value = json.loads(text, parse_constant=_reject_constant)
    _check_value(value, 0)
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON; write a finite number or a string")


def _check_value(value: Any, depth: int) -> None:
    """Raise ValueError for what strict JSON or UTF-8 cannot carry (iterative over containers)."""
    stack = [(value, depth)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, str):
            _check_string(item)
        elif isinstance(item, float) and not math.isfinite(item):
            raise ValueError("a number is too large for a float; write it as a string")
        elif isinstance(item, (dict, list)):
            if level >= MAX_ARGUMENT_DEPTH:
                raise ValueError(f"values are nested deeper than {MAX_ARGUMENT_DEPTH} levels")
            if isinstance(item, dict):
                for key in item:
                    _check_string(key)
                stack.extend((v, level + 1) for v in item.values())
            else:
                stack.extend((v, level + 1) for v in item)


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start : exc.start + 1]
        raise ValueError(
            f"a string holds the lone surrogate \\u{ord(bad):04x}, which is not a character; "
            "use valid Unicode"
        ) from None


def _short(exc: BaseException) -> str:
    """An exception's message, bounded (json's digit-limit message is long)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, RecursionError):
        text = "the JSON is nested too deeply"
    elif "integer string conversion" in text:  # Python's digit limit (sys.int_info)
        text = "an integer has too many digits; write it as a string"
    return text if len(text) <= 200 else text[:197] + "..."


def _json_type(value: Any) -> str:
    """How a JSON value's type reads in an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    if isinstance(value, list):
        return "an array"
    return "an object"
