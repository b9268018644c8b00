"""Tests for the Llama-3, Mistral and Qwen3-Coder parsers, format detection and reasoning splits."""

from __future__ import annotations

import json
from typing import get_args

import pytest

from looprl.rendering.formats import PARSERS, ParserName, detect_format, resolve_parser
from looprl.rendering.formats.llama3 import MISPLACED_CALL, Llama3JsonParser
from looprl.rendering.formats.mistral import MistralParser
from looprl.rendering.formats.qwen3_coder import BAD_XML, Qwen3CoderParser
from looprl.rendering.parser import (
    BAD_ARGUMENTS,
    BAD_NAME,
    INVALID_JSON,
    MISSING_NAME,
    MISSPELLED_TAG,
    NOT_OBJECT,
    UNCLOSED_TAG,
    ParsedTurn,
)
from looprl.rendering.reasoning import MISTRAL_THINK, THINK, reasoning_markers, split_reasoning

# --- Llama 3 JSON ---------------------------------------------------------------------------


def llama(text: str) -> ParsedTurn:
    return Llama3JsonParser().parse(text)


def test_llama_bare_call_and_python_tag() -> None:
    bare = llama(' {"name": "add", "parameters": {"a": 1}} ')
    assert [(c.name, c.arguments, c.id) for c in bare.calls] == [("add", {"a": 1}, "call_0")]
    assert bare.content == "" and bare.errors == []
    tagged = llama('Let me add.<|python_tag|>{"name": "add", "arguments": {"a": 2}}')
    assert tagged.content == "Let me add."
    assert [(c.name, c.arguments) for c in tagged.calls] == [("add", {"a": 2})]


def test_llama_several_calls_separated_by_semicolons() -> None:
    turn = llama('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": "y;z"}}')
    assert [(c.name, c.id) for c in turn.calls] == [("a", "call_0"), ("b", "call_1")]
    assert turn.calls[1].arguments == {"x": "y;z"}


def test_llama_text_after_the_calls_is_an_error_the_calls_still_run() -> None:
    turn = llama('{"name": "add", "parameters": {}} and then')
    assert [c.name for c in turn.calls] == ["add"]
    assert [(e.kind, e.id, e.raw) for e in turn.errors] == [(INVALID_JSON, "call_1", "and then")]
    assert "text after the tool call" in turn.errors[0].message


def test_llama_plain_answers_stay_answers() -> None:
    assert llama("The answer is 4.") == ParsedTurn(content="The answer is 4.")
    assert llama('{"answer": 4}') == ParsedTurn(content='{"answer": 4}')


LLAMA_MALFORMED = [
    ('{"name": "add", "parameters": {"a": 1}', INVALID_JSON),
    ('{"name": "add", "parameters": [1]}', BAD_ARGUMENTS),
    ('{"name": 3, "parameters": {}}', BAD_NAME),
    ('{"parameters": {"a": 1}}', MISSING_NAME),
    ('{"name": "add", "parameters": {"a": NaN}}', INVALID_JSON),
    ('{"name": "add", "parameters": {"a": "\\ud800"}}', INVALID_JSON),
    ('{"name": "add", "parameters": ' + "[" * 40 + "]" * 40 + "}", INVALID_JSON),
    ("<|python_tag|>brave_search.call(query='x')", NOT_OBJECT),
    ("<|python_tag|>", INVALID_JSON),
    ('Sure. {"name": "add", "parameters": {"a": 1}}', MISPLACED_CALL),
]


@pytest.mark.parametrize(("text", "kind"), LLAMA_MALFORMED)
def test_llama_malformed_calls_are_errors(text: str, kind: str) -> None:
    turn = llama(text)
    assert turn.calls == []
    assert [e.kind for e in turn.errors] == [kind]
    assert turn.errors[0].id == "call_0" and turn.errors[0].message


# --- Mistral --------------------------------------------------------------------------------


def test_mistral_calls_get_nine_character_ids() -> None:
    text = 'Checking. [TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, {"name": "b"}]'
    turn = MistralParser().parse(text)
    assert turn.content == "Checking."
    assert [(c.name, c.arguments, c.id) for c in turn.calls] == [
        ("a", {"x": 1}, "call00000"),
        ("b", {}, "call00001"),
    ]
    assert all(len(c.id) == 9 and c.id.isalnum() for c in turn.calls)


MISTRAL_MALFORMED = [
    ('[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}]', INVALID_JSON),
    ("[TOOL_CALLS]", INVALID_JSON),
    ('[TOOL_CALLS] {"name": "a", "arguments": {}}', NOT_OBJECT),
    ('[TOOL_CALLS] ["a"]', NOT_OBJECT),
    ('[TOOL_CALLS] [{"arguments": {}}]', MISSING_NAME),
    ('[TOOL_CALLS] [{"name": "a", "arguments": "x=1"}]', BAD_ARGUMENTS),
    ('[TOOL_CALLS] [{"name": "a", "arguments": {"v": Infinity}}]', INVALID_JSON),
    ('[TOOL_CALL] [{"name": "a", "arguments": {}}]', MISSPELLED_TAG),
]


@pytest.mark.parametrize(("text", "kind"), MISTRAL_MALFORMED)
def test_mistral_malformed_calls_are_errors(text: str, kind: str) -> None:
    turn = MistralParser().parse(text)
    assert turn.calls == []
    assert [e.kind for e in turn.errors] == [kind]
    assert turn.errors[0].id == "call00000"


def test_ordered_sorts_mistral_ids_by_number() -> None:
    turn = MistralParser().parse('[TOOL_CALLS] [3, {"name": "a"}] [TOOL_CALLS] [{"name": "b"}]')
    assert [item.id for item in turn.ordered()] == ["call00000", "call00001", "call00002"]


# --- Qwen3-Coder XML ------------------------------------------------------------------------


def coder_block(function: str, params: str) -> str:
    return f"<tool_call>\n<function={function}>\n{params}</function>\n</tool_call>"


def test_coder_parameters_are_strings_or_json() -> None:
    params = (
        "<parameter=query>\ncapital of\nFrance\n</parameter>\n"
        '<parameter=filters>\n{"year": 2020}\n</parameter>\n<parameter=k>\n3\n</parameter>\n'
    )
    turn = Qwen3CoderParser().parse("Searching.\n" + coder_block("search", params))
    assert turn.content == "Searching." and turn.errors == []
    [call] = turn.calls
    assert call.name == "search" and call.id == "call_0"
    assert call.arguments == {"query": "capital of\nFrance", "filters": {"year": 2020}, "k": "3"}


CODER_MALFORMED = [
    (coder_block("search", "<parameter=q>\nx\n</parameter>\n<parameter=q>\ny\n</parameter>\n"),
     BAD_ARGUMENTS),
    (coder_block("search", "<parameter=q>\n{bad\n</parameter>\n"), BAD_ARGUMENTS),
    (coder_block("search", "stray <parameter=q>\nx\n</parameter>\n"), BAD_XML),
    (coder_block("", ""), BAD_NAME),
    ('<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>', MISSING_NAME),
    ("<tool_call>\n<function=search>\n", UNCLOSED_TAG),
    ("<TOOL_CALL><function=a></function></TOOL_CALL>", MISSPELLED_TAG),
]  # fmt: skip


@pytest.mark.parametrize(("text", "kind"), CODER_MALFORMED)
def test_coder_malformed_calls_are_errors(text: str, kind: str) -> None:
    turn = Qwen3CoderParser().parse(text)
    assert turn.calls == []
    assert [e.kind for e in turn.errors] == [kind]
    assert "<function=" in turn.errors[0].message or kind in (BAD_ARGUMENTS, BAD_XML)


# --- detection ------------------------------------------------------------------------------

TEMPLATES = {
    "harmony": "{{ tools }}<|start|>assistant to=functions.x<|channel|>commentary<|message|><|call|>",
    "hermes": "{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>",
    "qwen3_coder": "{{ tools }}<tool_call>\n<function=' + name + '>\n<parameter=",
    "mistral": "{{ tools }}[TOOL_CALLS] [",
    "llama3_json": '{{ tools }}<|start_header_id|>{"name": function name, "parameters": ...}',
}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_detect_format(name: str) -> None:
    assert detect_format(TEMPLATES[name]) == name


def test_a_template_without_tools_is_hermes() -> None:
    assert detect_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "hermes"


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("{{ tools }}<function_call>{{ call }}</function_call>", "does not recognise"),
        ("{{ tools }}[TOOL_CALLS] <tool_call>", "several"),
        ("{{ tools }}[TOOL_CALLS]{{ name }}[ARGS]{{ args }}", "v11"),
    ],
)
def test_unreadable_formats_are_errors_naming_the_flag(template: str, words: str) -> None:
    with pytest.raises(ValueError, match="--model.parser") as caught:
        detect_format(template)
    assert words in str(caught.value)


def test_explicit_parser_wins_and_names_are_checked() -> None:
    assert isinstance(resolve_parser("hermes", TEMPLATES["mistral"]), type(PARSERS["hermes"]()))
    with pytest.raises(ValueError, match="unknown tool-call parser 'xml'"):
        resolve_parser("xml", "")


def test_config_parser_names_are_the_table() -> None:
    assert set(get_args(ParserName)) == {"auto", *PARSERS}


# --- reasoning ------------------------------------------------------------------------------

SPLITS = [
    ("<think>\nfirst\n</think>\n\nThe answer is 4.", ("first", "\n\nThe answer is 4.")),
    ("  <think>a</think>b", ("a", "b")),
    ("opened by the prompt\n</think>\n\nanswer", ("opened by the prompt", "\n\nanswer")),
    ("<think>\ncut off by the token limit", ("cut off by the token limit", "")),
    ("answer first <think>late</think>", ("", "answer first <think>late</think>")),
    ("no reasoning", ("", "no reasoning")),
]


@pytest.mark.parametrize(("text", "expected"), SPLITS)
def test_split_reasoning(text: str, expected: tuple[str, str]) -> None:
    assert split_reasoning(text, THINK) == expected


def test_template_markers() -> None:
    assert reasoning_markers("{{ '[THINK]' + r + '[/THINK]' }}") == MISTRAL_THINK
    assert reasoning_markers("{{ '<think>' }}") == THINK
    assert split_reasoning("[THINK]plan[/THINK]go", MISTRAL_THINK) == ("plan", "go")


def test_strict_json_rules_hold_in_every_json_format() -> None:
    """NaN and lone surrogates fail the same way whichever format carries them."""
    bad = json.dumps({"a": "x"}).replace('"x"', "NaN")
    texts = {
        "llama3_json": '{"name": "t", "parameters": ' + bad + "}",
        "mistral": '[TOOL_CALLS] [{"name": "t", "arguments": ' + bad + "}]",
        "hermes": '<tool_call>{"name": "t", "arguments": ' + bad + "}</tool_call>",
        "qwen3_coder": coder_block("t", "<parameter=a>\n" + bad + "\n</parameter>\n"),
    }
    for name, text in texts.items():
        turn = PARSERS[name]().parse(text)
        assert turn.calls == [] and len(turn.errors) == 1, name
        assert "NaN" in turn.errors[0].message, (name, turn.errors[0].message)
