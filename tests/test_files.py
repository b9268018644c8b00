"""Tier 1: the one JSONL reader: objects with their line numbers, and errors naming the line."""

from __future__ import annotations

import pytest

from looprl.files import iter_jsonl


def test_rows_come_with_their_line_numbers_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "rows.jsonl"
    # U+2028 is valid inside a JSON string; str.splitlines would cut line 4 there
    path.write_bytes('{"a": 1}\n\n  \n{"b": "x\u2028y"}\r\n{"c": []}'.encode())
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (4, {"b": "x\u2028y"}), (5, {"c": []})]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b'{"a": 1}\n{"a": \n', r"rows.jsonl:2: not valid JSON \(Expecting value\); FIX"),
        (b'{"a": 1}\n[1, 2]\n', r"rows.jsonl:2: a JSON array, not an object; FIX"),
        (b'"text"\n', r"rows.jsonl:1: a JSON string, not an object; FIX"),
        (b"null\n", r"rows.jsonl:1: a JSON null, not an object; FIX"),
        (b'{"a": 1}\n{"a": "\xff"}\n', r"rows.jsonl:2: not UTF-8 \(byte 7 of the line\); save"),
    ],
)
def test_a_bad_line_raises_naming_the_file_the_line_and_the_fix(tmp_path, text, message):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(text)
    with pytest.raises(ValueError, match=message):
        list(iter_jsonl(path, fix="FIX"))


def test_rows_before_a_bad_line_are_read_lazily(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\nnot json\n', encoding="utf-8")
    rows = iter_jsonl(path)
    assert next(rows) == (1, {"a": 1})
    with pytest.raises(ValueError, match="rows.jsonl:2: not valid JSON"):
        next(rows)
