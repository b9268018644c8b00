"""Tests for the tool-call parser: well-formed blocks and every kind of malformed block."""

from __future__ import annotations

import pytest

from looprl.rendering.formats import PARSERS, get_parser
from looprl.rendering.parser import (
    BAD_ARGUMENTS,
    BAD_NAME,
    INVALID_JSON,
    MISSING_NAME,
    NOT_OBJECT,
    UNCLOSED_TAG,
    HermesParser,
    ParsedTurn,
    ToolCallParser,
)
from looprl.types import ToolCall


def parse(text: str) -> ParsedTurn:
    return HermesParser().parse(text)


def test_plain_text_has_no_calls() -> None:
    turn = parse("  The answer is 4.  ")
    assert turn == ParsedTurn(content="The answer is 4.", calls=[], errors=[])


def test_one_call() -> None:
    block = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    turn = parse(block)
    assert turn.content == ""
    assert turn.calls == [ToolCall(name="add", arguments={"a": 1, "b": 2}, id="call_0", raw=block)]
    assert turn.errors == []


def test_whitespace_and_newlines_around_json() -> None:
    block = '<tool_call>\n  {"name": "add",\n "arguments": {"a": 1}}\n\n</tool_call>'
    turn = parse(f"Let me add.\n{block}\n")
    assert turn.content == "Let me add."
    assert turn.calls[0].arguments == {"a": 1}
    assert turn.calls[0].raw == block


def test_several_calls_with_surrounding_text() -> None:
    text = (
        "First I search.\n"
        '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>\n'
        "then I add\n"
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
        "done."
    )
    turn = parse(text)
    assert [c.name for c in turn.calls] == ["search", "add"]
    assert [c.id for c in turn.calls] == ["call_0", "call_1"]
    assert turn.content == "First I search.\n\nthen I add\n\ndone."
    assert turn.errors == []


def test_arguments_as_json_string() -> None:
    turn = parse('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>')
    assert turn.calls[0].arguments == {"a": 1, "b": 2}


def test_missing_arguments_means_empty_and_extra_keys_ignored() -> None:
    turn = parse('<tool_call>{"name": "now", "id": "abc"}</tool_call>')
    assert turn.calls == [ToolCall(name="now", arguments={}, id="call_0", raw=turn.calls[0].raw)]


def test_parameters_alias() -> None:
    turn = parse('<tool_call>{"name": "add", "parameters": {"a": 1}}</tool_call>')
    assert turn.calls[0].arguments == {"a": 1}


def test_ids_count_malformed_blocks_in_order() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        "<tool_call>oops</tool_call>"
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    )
    turn = parse(text)
    assert [c.id for c in turn.calls] == ["call_0", "call_2"]
    assert [e.id for e in turn.errors] == ["call_1"]
    assert [item.id for item in turn.ordered()] == ["call_0", "call_1", "call_2"]


def test_stray_closing_tag_stays_in_text() -> None:
    turn = parse("hello </tool_call> world")
    assert turn.content == "hello </tool_call> world"
    assert turn.calls == [] and turn.errors == []


MALFORMED = [
    # (text inside/around, kind, words the message must contain)
    (
        '<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>',
        INVALID_JSON,
        ["invalid JSON", "line 1", "column"],
    ),
    ("<tool_call>name: add</tool_call>", INVALID_JSON, ["invalid JSON", "char 0"]),
    ("<tool_call>   </tool_call>", INVALID_JSON, ["empty"]),
    ('<tool_call>```json\n{"name": "a"}\n```</tool_call>', INVALID_JSON, ["invalid JSON"]),
    ('<tool_call>{"name": "a"} trailing</tool_call>', INVALID_JSON, ["Extra data"]),
    ('<tool_call>[{"name": "add"}]</tool_call>', NOT_OBJECT, ["JSON object", "an array"]),
    ('<tool_call>"add"</tool_call>', NOT_OBJECT, ["JSON object", "a string"]),
    ('<tool_call>{"arguments": {"a": 1}}</tool_call>', MISSING_NAME, ['no "name"']),
    (
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        BAD_NAME,
        ['"name" must be', "a number (3)"],
    ),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', BAD_NAME, ["empty string"]),
    ('<tool_call>{"name": null}</tool_call>', BAD_NAME, ["null"]),
    (
        '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',
        BAD_ARGUMENTS,
        ['"arguments" must be a JSON object', "an array"],
    ),
    (
        '<tool_call>{"name": "add", "arguments": "a=1"}</tool_call>',
        BAD_ARGUMENTS,
        ["string but not valid JSON"],
    ),
    ('<tool_call>{"name": "add", "arguments": "[1]"}</tool_call>', BAD_ARGUMENTS, ["an array"]),
    (
        '<tool_call>{"name": "add", "parameters": 5}</tool_call>',
        BAD_ARGUMENTS,
        ['"parameters" must be', "a number (5)"],
    ),
    (
        '<tool_call>{"name": "add", "arguments": {}, "parameters": {}}</tool_call>',
        BAD_ARGUMENTS,
        ["once"],
    ),
    (
        '<tool_call>{"name": "add", "arguments": {"a": 1}}',
        UNCLOSED_TAG,
        ["never closed", "</tool_call>"],
    ),
    ('<tool_call>{"name": "add", "argu', UNCLOSED_TAG, ["never closed"]),
]


@pytest.mark.parametrize(("text", "kind", "words"), MALFORMED)
def test_malformed(text: str, kind: str, words: list[str]) -> None:
    turn = HermesParser().parse(f"Thinking. {text}")
    assert turn.calls == []
    assert len(turn.errors) == 1
    err = turn.errors[0]
    assert err.kind == kind
    for word in words:
        assert word in err.message, (word, err.message)
    assert err.raw == text
    assert err.id == "call_0"
    assert turn.content == "Thinking."


def test_bad_arguments_keeps_the_name() -> None:
    err = parse('<tool_call>{"name": "add", "arguments": 7}</tool_call>').errors[0]
    assert err.name == "add"


def test_unclosed_block_followed_by_good_block() -> None:
    text = '<tool_call>{"name": "a"}\n<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    turn = parse(text)
    assert [(e.kind, e.id, e.raw) for e in turn.errors] == [
        (UNCLOSED_TAG, "call_0", '<tool_call>{"name": "a"}\n')
    ]
    assert [(c.name, c.id) for c in turn.calls] == [("b", "call_1")]


def test_registry() -> None:
    assert isinstance(get_parser("hermes"), HermesParser)
    assert isinstance(get_parser("hermes"), ToolCallParser)
    assert set(PARSERS) == {"harmony", "hermes", "llama3_json", "mistral", "qwen3_coder"}
    with pytest.raises(ValueError, match="unknown tool-call parser 'xml'.*hermes"):
        get_parser("xml")
