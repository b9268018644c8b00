"""Qwen3-Coder XML tool calls: `<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>`.

Qwen3-Coder's chat template writes each call as

    <tool_call>
    <function=search>
    <parameter=query>
    capital of France
    </parameter>
    </function>
    </tool_call>

Rules of `Qwen3CoderParser` (the blocks themselves follow `HermesParser`'s rules: unclosed and
misspelled `<tool_call>` tags, ids `call_0`, `call_1`, ... in order):

- inside a block: exactly one `<function=NAME>...</function>`, whitespace around it and nothing
  else; inside the function only `<parameter=KEY>...</parameter>` elements and whitespace;
- a value loses the one newline the template writes on each side of it; a value that starts
  with `{` or `[` is strict JSON (the template writes objects and arrays with `tojson`), any
  other value is a string (the tool's signature coerces "3" to a number where it asks for one);
- a repeated parameter, bad JSON in an object or array value, a missing or empty function name
  and stray text are malformed calls with a message, as in every format.
"""

from __future__ import annotations

import re
from typing import Any

from looprl.rendering.parser import (
    BAD_ARGUMENTS,
    BAD_NAME,
    MISSING_NAME,
    HermesParser,
    ParseError,
    strict_loads,
)
from looprl.types import ToolCall

BAD_XML = "bad_xml"
EXAMPLE = (
    "<tool_call>\n<function=tool_name>\n<parameter=arg>\nvalue\n</parameter>\n</function>\n"
    "</tool_call>"
)
_FUNCTION = re.compile(r"\A\s*<function=([^>\n]*)>(.*)</function>\s*\Z", re.DOTALL)
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]*)>(.*?)</parameter>\s*", re.DOTALL)


class Qwen3CoderParser(HermesParser):
    """Parses Qwen3-Coder's XML calls inside `<tool_call>` blocks (see the module doc)."""

    example = EXAMPLE

    def parse_body(self, body: str, raw: str, call_id: str) -> ToolCall | ParseError:
        """One block's `<function=...>` element as a call, or what is wrong with it."""

        def error(kind: str, message: str, name: str = "") -> ParseError:
            return ParseError(kind, message, raw, call_id, name)

        match = _FUNCTION.match(body)
        if match is None:
            kind = BAD_XML if "<function=" in body else MISSING_NAME
            return error(
                kind,
                "a <tool_call> block holds one <function=NAME>...</function> element and "
                f"nothing else; write {EXAMPLE}",
            )
        name, inner = match.group(1).strip(), match.group(2)
        if not name:
            return error(BAD_NAME, f"<function=> names no tool; write {EXAMPLE}")
        arguments: dict[str, Any] = {}
        pos = 0
        for param in _PARAMETER.finditer(inner):
            if param.start() != pos:
                break
            pos = param.end()
            key, value = param.group(1).strip(), _value(param.group(2))
            if isinstance(value, ParseError) or key in arguments or not key:
                problem = value.message if isinstance(value, ParseError) else None
                problem = problem or f"parameter {key!r} is empty-named or given twice"
                return error(BAD_ARGUMENTS, f"{problem}; write {EXAMPLE}", name)
            arguments[key] = value
        if inner[pos:].strip():
            stray = inner[pos:].strip()[:40]
            return error(
                BAD_XML,
                f"unexpected text {stray!r} inside <function={name}>; only "
                f"<parameter=KEY>value</parameter> elements go there",
                name,
            )
        return ToolCall(name=name, arguments=arguments, id=call_id, raw=raw)


def _value(text: str) -> Any:
    """A parameter's value: JSON for objects and arrays, else the text (template newlines cut)."""
    text = text.removeprefix("\n").removesuffix("\n")
    try:
        if text.lstrip().startswith(("{", "[")):
            return strict_loads(text)
        text.encode("utf-8")  # a lone surrogate is no character (the rule of every format)
        return text
    except UnicodeEncodeError:
        return ParseError(BAD_ARGUMENTS, "a value holds a lone surrogate; use valid Unicode", text)
    except (ValueError, RecursionError) as exc:
        message = f"a value starting with {{ or [ must be valid JSON ({str(exc)[:120]})"
        return ParseError(BAD_ARGUMENTS, message, text)
