"""Mistral tool calls: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (v3 tokenizers).

Mistral-7B-Instruct-v0.3, Mixtral-8x22B-Instruct and Mistral-Nemo write every call of a turn as
one JSON array after the `[TOOL_CALLS]` control token. Rules of `MistralParser`:

- the text before `[TOOL_CALLS]` is content; after it comes one JSON array of call objects and
  nothing else (up to the next `[TOOL_CALLS]`, which starts another array);
- each object is read like a Hermes call (`arguments` or `parameters`, strict JSON, the same
  error kinds); an `id` the model wrote is ignored;
- a JSON value that is not an array, or an element that is not an object, is `not_object`;
- calls get the ids `call00000`, `call00001`, ...: Mistral's template refuses any id that is not
  nine alphanumeric characters, and every call is answered with a tool message that quotes it;
- a near miss of the marker (`[TOOL_CALL]`, `[tool_calls]`) is `misspelled_tag`.

The newer `[TOOL_CALLS]name[ARGS]{...}` form of v11+ tokenizers (Mistral Small 3.2) is not
parsed: give it a template and parser of your own, or `--model.chat_template looprl`.
"""

from __future__ import annotations

import re

from looprl.rendering.parser import (
    MISSPELLED_TAG,
    NOT_OBJECT,
    ParsedTurn,
    ParseError,
    call_from_json,
    call_from_object,
    strict_loads,
)
from looprl.types import ToolCall

TOOL_CALLS = "[TOOL_CALLS]"
EXAMPLE = '[TOOL_CALLS] [{"name": "tool_name", "arguments": {"arg": "value"}}]'
_NEAR_MISS = re.compile(r"\[\s*tool[\s_\-]?calls?\s*\]", re.IGNORECASE)


def mistral_call_id(index: int) -> str:
    """The `index`-th call id of a turn: nine alphanumeric characters, as Mistral's template asks."""
    return f"call{index:05d}"


class MistralParser:
    """Parses `[TOOL_CALLS]` JSON arrays (see the module doc)."""

    markers: tuple[str, ...] = (TOOL_CALLS,)
    """`[TOOL_CALLS]` is a control token: decoding must keep it for the parser."""

    def parse(self, text: str) -> ParsedTurn:
        """Split `text` into content, calls and errors."""
        content, *blocks = text.split(TOOL_CALLS)
        results: list[ToolCall | ParseError] = []
        for block in blocks:
            results += _block_calls(block, len(results))
        for match in dict.fromkeys(_NEAR_MISS.findall(content)):
            message = f"{match!r} is not the tool-call marker, so no tool ran; write {EXAMPLE}"
            results.append(
                ParseError(MISSPELLED_TAG, message, match, mistral_call_id(len(results)))
            )
        return ParsedTurn(
            content=content.strip(),
            calls=[r for r in results if isinstance(r, ToolCall)],
            errors=[r for r in results if isinstance(r, ParseError)],
        )


def _block_calls(block: str, start: int) -> list[ToolCall | ParseError]:
    """The calls (or errors) of the array after one `[TOOL_CALLS]`, ids counted from `start`."""
    raw = TOOL_CALLS + block
    try:
        value = strict_loads(block)
    except (ValueError, RecursionError):  # call_from_json words it as every format does
        return [call_from_json(block, raw, mistral_call_id(start), tag=TOOL_CALLS, example=EXAMPLE)]
    if not isinstance(value, list):
        message = f"{TOOL_CALLS} must be followed by a JSON array of calls: {EXAMPLE}"
        return [ParseError(NOT_OBJECT, message, raw, mistral_call_id(start))]
    out: list[ToolCall | ParseError] = []
    for offset, item in enumerate(value):
        call_id = mistral_call_id(start + offset)
        if isinstance(item, dict):
            out.append(call_from_object(item, raw, call_id, example=EXAMPLE))
        else:
            message = f"each element after {TOOL_CALLS} must be a JSON object: {EXAMPLE}"
            out.append(ParseError(NOT_OBJECT, message, raw, call_id))
    return out
