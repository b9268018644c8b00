"""Tests of looprl's ChatML tool template: format, tool section, and prefix safety."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from looprl.rendering.templates import (
    CHATML_TOOLS_TEMPLATE,
    ensure_tool_template,
    template_supports_tools,
)

CALC = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}


def call(name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI-format tool call."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS: list[list[dict[str, Any]]] = [
    [
        {"role": "user", "content": "Compute 3417 * 29 + 881."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("calculate", {"expression": "3417 * 29 + 881"})],
        },
        {"role": "tool", "content": "99974", "tool_call_id": "call_0"},
        {"role": "assistant", "content": "The answer is 99974."},
        {"role": "user", "content": "And halve it?"},
        {"role": "assistant", "content": "Half is 49987."},
    ],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Two things: 2+2 and search cats. ünïcødé 🤖"},
        {
            "role": "assistant",
            "content": "Doing both.",
            "tool_calls": [
                call("calculate", '{"expression": "2+2"}'),  # arguments as a JSON string
                call("search", {"query": "cats", "limit": 3}),
            ],
        },
        {"role": "tool", "content": "4", "tool_call_id": "call_0", "name": "calculate"},
        {"role": "tool", "content": "cats are mammals", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "4; cats are mammals."},
    ],
    [
        {"role": "user", "content": "  leading and trailing spaces  \n"},
        {"role": "assistant", "content": None, "tool_calls": [{"name": "search", "arguments": {}}]},
        {"role": "tool", "content": ""},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "part one, "},
                {"type": "text", "text": "part two"},
            ],
        },
        {"role": "assistant", "content": "done"},
    ],
]


def render(
    messages: list[dict[str, Any]], tools: list[dict] | None = None, gen: bool = False
) -> str:
    """Render with the same Jinja environment `tokenizer.apply_chat_template` uses."""
    tool_list: Any = tools
    result: Any = render_jinja_template(
        [messages], tools=tool_list, chat_template=CHATML_TOOLS_TEMPLATE, add_generation_prompt=gen
    )
    return result[0][0]


@pytest.mark.parametrize("tools", [None, [CALC], [CALC, SEARCH]])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_prefix_safe(conversation: list[dict[str, Any]], tools: list[dict] | None) -> None:
    """messages[:k] renders to a prefix of messages[:k+n], with and without the generation prompt."""
    renders = [render(conversation[:k], tools) for k in range(len(conversation) + 1)]
    for k in range(len(renders)):
        for later in renders[k:]:
            assert later.startswith(renders[k])
    for k in range(len(conversation) + 1):
        prompt = render(conversation[:k], tools, gen=True)
        answered = render([*conversation[:k], {"role": "assistant", "content": "x"}], tools)
        assert answered.startswith(prompt)
        assert prompt.endswith("<|im_start|>assistant\n")


def test_exact_format_of_a_tool_turn() -> None:
    """One full conversation renders to exactly the documented ChatML + <tool_call> text."""
    text = render(CONVERSATIONS[0][:4], tools=None)
    assert text == (
        "<|im_start|>user\nCompute 3417 * 29 + 881.<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "calculate", "arguments": {"expression": "3417 * 29 + 881"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>tool\n99974<|im_end|>\n"
        "<|im_start|>assistant\nThe answer is 99974.<|im_end|>\n"
    )


def test_content_then_calls_separated_by_newlines() -> None:
    """Content is followed by a newline before the first call; calls are newline-separated."""
    text = render(CONVERSATIONS[1][2:3])
    assert text == (
        "<|im_start|>assistant\nDoing both.\n<tool_call>\n"
        '{"name": "calculate", "arguments": {"expression": "2+2"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "search", "arguments": {"query": "cats", "limit": 3}}\n</tool_call><|im_end|>\n'
    )


def test_tool_section_lists_each_tool_as_json() -> None:
    """With tools, the system message ends with a <tools> block: one JSON schema per line."""
    text = render(CONVERSATIONS[1][:2], tools=[CALC, SEARCH])
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    block = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in block.split("\n")] == [CALC, SEARCH]
    assert (
        '<tool_call>\n{"name": "tool_name", "arguments": {"argument": "value"}}\n</tool_call>'
        in text
    )
    assert text.count("<|im_start|>system") == 1


def test_system_message_generated_only_with_tools() -> None:
    """No default system prompt without tools; a generated one carries the tool section."""
    user = [{"role": "user", "content": "hi"}]
    assert render(user) == "<|im_start|>user\nhi<|im_end|>\n"
    with_tools = render(user, tools=[CALC])
    assert with_tools.startswith("<|im_start|>system\n") and "<tools>" in with_tools
    assert render([], tools=[CALC]) == ""
    assert render([], tools=[CALC], gen=True).endswith(
        "</tool_call><|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_works_through_a_tokenizer() -> None:
    """`apply_chat_template` on a tokenizer with our template gives the same text."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    assert not template_supports_tools(tok)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ensure_tool_template(tok) is True
    assert any("<|im_start|>" in str(w.message) for w in caught)  # the markers are unknown tokens
    assert template_supports_tools(tok)
    assert ensure_tool_template(tok) is False  # already tool-capable: kept
    text = tok.apply_chat_template(CONVERSATIONS[0], tools=[CALC], tokenize=False)
    assert text == render(CONVERSATIONS[0], tools=[CALC])


def test_template_support_detection() -> None:
    """Templates that never read `tools` are detected; dict-of-templates is handled."""

    class Tok:
        chat_template: Any = None

    tok = Tok()
    assert not template_supports_tools(tok)
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert not template_supports_tools(tok)
    tok.chat_template = {"default": "x", "tool_use": "{{ tools }}"}
    assert template_supports_tools(tok)


def test_same_text_under_other_jinja_settings() -> None:
    """Plain Jinja (no trim_blocks / lstrip_blocks), as other servers may use, renders identically."""
    import jinja2

    env = jinja2.Environment(trim_blocks=False, lstrip_blocks=False)
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    template = env.from_string(CHATML_TOOLS_TEMPLATE)
    for conversation in CONVERSATIONS:
        for tools in (None, [CALC]):
            plain = template.render(messages=conversation, tools=tools, add_generation_prompt=True)
            assert plain == render(conversation, tools, gen=True)
