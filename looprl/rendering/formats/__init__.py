"""Tool-call formats by name, and which one a chat template declares (`--model.parser auto`).

| name          | a call looks like                                                 | models |
|---------------|-------------------------------------------------------------------|--------|
| `hermes`      | `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`        | Qwen2.5, Qwen3, Hermes, looprl's ChatML |
| `llama3_json` | `{"name": ..., "parameters": {...}}` alone, or after `<|python_tag|>` | Llama 3.1 / 3.2 / 3.3 |
| `mistral`     | `[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`                | Mistral v0.3, Mixtral, Nemo |
| `qwen3_coder` | `<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>` | Qwen3-Coder |
| `harmony`     | `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>` | gpt-oss |

`detect_format` reads the chat template's text for each format's signature. A template that
renders tools in none of them or in more than one is an error naming `--model.parser`, never a
silent zero calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from looprl.rendering.formats.harmony import HarmonyParser
from looprl.rendering.formats.llama3 import Llama3JsonParser
from looprl.rendering.formats.mistral import MistralParser
from looprl.rendering.formats.qwen3_coder import Qwen3CoderParser
from looprl.rendering.parser import HermesParser, ToolCallParser

PARSERS: dict[str, Callable[[], ToolCallParser]] = {
    "harmony": HarmonyParser,
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "qwen3_coder": Qwen3CoderParser,
}
"""Tool-call parsers by the name `--model.parser` (and `Environment(parser=...)`) takes."""

ParserName = Literal["auto", "harmony", "hermes", "llama3_json", "mistral", "qwen3_coder"]
"""`--model.parser` values: `auto` and the names of `PARSERS` (a test keeps them equal)."""

SIGNATURES: dict[str, tuple[tuple[str, ...], ...]] = {
    "harmony": (("<|call|>", "<|channel|>"),),
    "qwen3_coder": (("<function=", "<parameter="),),
    "mistral": (("[TOOL_CALLS]",),),
    "llama3_json": (("<|python_tag|>",), ("<|start_header_id|>", '"parameters"')),
    "hermes": (("<tool_call>",),),
}
"""Texts whose presence (all of one tuple) in a chat template declares a format."""

UNSUPPORTED: dict[str, str] = {
    "[ARGS]": "Mistral v11+ ([TOOL_CALLS]NAME[ARGS]{...})",
}
"""Signatures of formats a template may declare that no parser here reads."""


def detect_format(template_text: str) -> str:
    """The parser name a chat template's tool format calls for; ValueError when unclear.

    A template that never reads `tools` declares no format: `hermes` (looprl installs its
    ChatML template on such tokenizers when it loads them).
    """
    if "tools" not in template_text:
        return "hermes"
    for signature, what in UNSUPPORTED.items():
        if signature in template_text:
            raise ValueError(
                f"the chat template writes tool calls as {what}, which no looprl parser reads; "
                "set --model.chat_template looprl (ChatML with <tool_call> calls) or pass a "
                f"--model.parser that matches what the model writes ({sorted(PARSERS)})"
            )
    found = [
        name
        for name, options in SIGNATURES.items()
        if any(all(text in template_text for text in option) for option in options)
    ]
    if "qwen3_coder" in found:  # its blocks are <tool_call> tags too
        found.remove("hermes")
    if len(found) == 1:
        return found[0]
    problem = (
        f"matches several tool-call formats {found}"
        if found
        else "renders tools in a format looprl does not recognise"
    )
    raise ValueError(
        f"the chat template {problem}; set --model.parser to one of {sorted(PARSERS)} "
        "(or --model.chat_template looprl for looprl's ChatML template and its <tool_call> format)"
    )


def get_parser(name: str) -> ToolCallParser:
    """A parser instance by name (`PARSERS`); unknown names raise ValueError listing the known ones."""
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(
            f"unknown tool-call parser {name!r}; choose one of {sorted(PARSERS)}"
        ) from None


def resolve_parser(name: str, template_text: str) -> ToolCallParser:
    """The parser `name` (`auto`: the one `detect_format` finds in `template_text`)."""
    if name == "auto":
        name = detect_format(template_text)
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(
            f"unknown tool-call parser {name!r}; choose auto or one of {sorted(PARSERS)}"
        ) from None
