"""Llama-3.x JSON tool calls: a bare `{"name": ..., "parameters": {...}}` turn, or after `<|python_tag|>`.

Llama 3.1, 3.2 and 3.3 chat templates ask the model to answer a tool call with a JSON object
and nothing else; Llama 3.1 may also open the call with the `<|python_tag|>` token. Rules of
`Llama3JsonParser`, decided here once:

- a turn whose text (stripped) starts with `{` is a tool-call turn: one JSON object, or several
  separated by `;` (vLLM's llama3_json convention); text after them is a malformed call
  (`invalid_json`) while the calls before it still run;
- text after `<|python_tag|>` is a tool-call turn the same way; the text before it is content;
- a JSON object with neither `name` nor `parameters`/`arguments` at the start of a turn is a
  plain answer (some tasks ask for JSON), not a call;
- `{"name": ..., "parameters": ...}` written *after* other text is a malformed call of kind
  `misplaced_call`: the template told the model to answer with the object alone, and taking it
  as a plain answer would silently count zero calls;
- the object is read like a Hermes call (`parameters` or `arguments`, strict JSON, the same
  error kinds and messages); ids are `call_0`, `call_1`, ...

Built-in tools (`brave_search.call(...)`) and code after `<|python_tag|>` are not JSON: they are
malformed calls (`not_object`) that tell the model to write the JSON object instead.
"""

from __future__ import annotations

import json
import re
from typing import Any

from looprl.rendering.parser import (
    INVALID_JSON,
    NOT_OBJECT,
    ParsedTurn,
    ParseError,
    call_from_object,
    strict_loads,
)
from looprl.types import ToolCall

PYTHON_TAG = "<|python_tag|>"
MISPLACED_CALL = "misplaced_call"
EXAMPLE = '{"name": "tool_name", "parameters": {"arg": "value"}}'
_CALL_LIKE = re.compile(r'\{\s*"name"\s*:\s*"[^"]*"\s*,\s*"(?:parameters|arguments)"\s*:')


class Llama3JsonParser:
    """Parses Llama-3.x JSON tool calls (see the module doc)."""

    markers: tuple[str, ...] = (PYTHON_TAG,)
    """`<|python_tag|>` is a special token: decoding must keep it for the parser."""

    def parse(self, text: str) -> ParsedTurn:
        """Split `text` into content, calls and errors."""
        before, tag, after = text.partition(PYTHON_TAG)
        if tag:
            return _calls_turn(before.strip(), after)
        if text.lstrip().startswith("{"):
            turn = _calls_turn("", text)
            if not _plain_json_answer(text, turn):
                return turn
        match = _CALL_LIKE.search(text)
        if match is None:
            return ParsedTurn(content=text.strip())
        raw = text[match.start() :]
        message = (
            "a tool call must be the whole reply, with no text before it, so no tool ran; "
            f"answer with the JSON object alone: {EXAMPLE}"
        )
        error = ParseError(MISPLACED_CALL, message, raw, "call_0")
        return ParsedTurn(content=text[: match.start()].strip(), errors=[error])


def _plain_json_answer(text: str, turn: ParsedTurn) -> bool:
    """A turn that is one JSON object naming no tool: an answer written in JSON."""
    if turn.calls or len(turn.errors) != 1 or turn.errors[0].kind == INVALID_JSON:
        return False
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return isinstance(obj, dict) and not ({"name", "parameters", "arguments"} & set(obj))


def _calls_turn(content: str, body: str) -> ParsedTurn:
    """A tool-call turn: `body` holds JSON objects separated by `;`, nothing else."""
    turn = ParsedTurn(content=content)
    for index, (raw, value) in enumerate(_objects(body)):
        call_id = f"call_{index}"
        result: ToolCall | ParseError
        if isinstance(value, ParseError):
            result = ParseError(value.kind, value.message, raw, call_id)
        elif not isinstance(value, dict):
            message = (
                f"a tool call must be a JSON object like {EXAMPLE}, got {type(value).__name__}"
            )
            result = ParseError(NOT_OBJECT, message, raw, call_id)
        else:
            result = call_from_object(value, raw, call_id, example=EXAMPLE)
        (turn.calls if isinstance(result, ToolCall) else turn.errors).append(result)  # type: ignore[arg-type]
    return turn


def _objects(body: str) -> list[tuple[str, Any]]:
    """Each `;`-separated JSON value of `body` with its raw text; a ParseError where one fails."""
    decoder = json.JSONDecoder()
    out: list[tuple[str, Any]] = []
    pos = _skip_space(body, 0)
    if pos == len(body):
        message = f"nothing follows {PYTHON_TAG}; write a JSON object like {EXAMPLE}"
        return [(body, ParseError(INVALID_JSON, message, body))]
    if body[pos] not in "{[":
        message = (
            f"after {PYTHON_TAG} write a JSON object like {EXAMPLE}; code and built-in tools "
            "are not run here"
        )
        return [(body[pos:], ParseError(NOT_OBJECT, message, body[pos:]))]
    while pos < len(body):
        try:
            value, end = decoder.raw_decode(body, pos)
            raw = body[pos:end]
            strict_loads(raw)  # NaN, depth, surrogates, digit limit: the rules of every format
        except (ValueError, RecursionError) as exc:
            message = f"invalid JSON in the tool call: {exc}; write a JSON object like {EXAMPLE}"
            return [*out, (body[pos:], ParseError(INVALID_JSON, message[:400], body[pos:]))]
        out.append((raw, value))
        pos = _skip_space(body, end)
        if body.startswith(";", pos):
            pos = _skip_space(body, pos + 1)
        elif pos < len(body):
            message = (
                f"text after the tool call ({body[pos : pos + 40]!r}); a tool-call reply holds "
                f"only JSON objects like {EXAMPLE}, separated by ';'"
            )
            return [*out, (body[pos:], ParseError(INVALID_JSON, message, body[pos:]))]
    return out


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
