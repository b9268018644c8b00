"""Tier 1: the one JSONL reader (line numbers, errors naming the line); a file imports its siblings."""

from __future__ import annotations

from pathlib import Path

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


def _two_files(folder, value: int, relative: bool = False):
    """A folder holding `env_main.py`, which imports `helpers.py` beside it; the main file."""
    folder.mkdir(parents=True)
    (folder / "helpers.py").write_text(f"VALUE = {value}\n")
    dot = "." if relative else ""
    (folder / "env_main.py").write_text(f"from {dot}helpers import VALUE\n\nGOT = VALUE\n")
    return folder / "env_main.py"


def test_a_file_imports_the_files_beside_it_and_leaves_no_trace(tmp_path, monkeypatch):
    import sys
    import types

    from looprl.files import import_module_or_file

    other = types.ModuleType("helpers")  # someone else's `helpers`, imported before
    monkeypatch.setitem(sys.modules, "helpers", other)
    path_before = list(sys.path)
    one = import_module_or_file(str(_two_files(tmp_path / "one", 1)))
    two = import_module_or_file(str(_two_files(tmp_path / "two", 2)))
    rel = import_module_or_file(str(_two_files(tmp_path / "rel", 3, relative=True)))
    assert (one.GOT, two.GOT, rel.GOT) == (1, 2, 3)  # each folder its own helpers
    assert sys.modules["helpers"] is other and sys.path == path_before


def test_a_multi_file_environment_recipe_runs_from_the_cli(tmp_path, monkeypatch):
    """docs/environments.md, "An environment of several files": `looprl probe rectangles/env.py`."""
    import re
    import sys

    from looprl.cli.main import main

    doc = (Path(__file__).resolve().parents[1] / "docs" / "environments.md").read_text()
    section = doc.split("## An environment of several files", 1)[1]
    geometry, env = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)[:2]
    (tmp_path / "rectangles").mkdir()
    (tmp_path / "rectangles" / "geometry.py").write_text(geometry)
    (tmp_path / "rectangles" / "env.py").write_text(env)
    monkeypatch.chdir(tmp_path)
    argv = ["probe", "rectangles/env.py", "--tasks", "4", "--strict", "--out", "out"]
    assert main(argv) == 0  # as the doc says: every exploit resisted
    assert "geometry" not in sys.modules


def test_a_torn_last_line_is_cut_and_complete_lines_are_kept(tmp_path):
    from looprl.files import cut_torn_tail

    path = tmp_path / "a.jsonl"
    for data, cut, after in [
        (b'{"a": 1}\n{"a": 2}\n', 0, b'{"a": 1}\n{"a": 2}\n'),  # whole: untouched
        (b'{"a": 1}\n{"a": 2', 7, b'{"a": 1}\n'),  # torn: cut
        (b'{"a": 1}\n{"a": 2}', 0, b'{"a": 1}\n{"a": 2}\n'),  # complete, no newline: given one
        (b'{"a": "\xc3', 8, b""),  # the only line, torn inside a character's bytes
        (b"", 0, b""),
        (b'{"k": 1}\n{"k": "' + b"x" * 200_000, 200_007, b'{"k": 1}\n'),  # past the 64 KiB chunk
    ]:
        path.write_bytes(data)
        assert cut_torn_tail(path) == cut, data[:20]
        assert path.read_bytes() == after


def test_a_line_over_max_line_bytes_is_refused_at_its_line(tmp_path):
    path = tmp_path / "a.jsonl"
    fits = b'{"k": "' + b"x" * 9 + b'"}'  # 18 bytes before its newline
    path.write_bytes(fits + b"\n" + fits + b"x\n")
    with pytest.raises(ValueError, match=r"a.jsonl:2: longer than 18 bytes \(read no further\)"):
        list(iter_jsonl(path, max_line_bytes=18))
    path.write_bytes(fits + b"\n" + fits)  # the last line, without a newline, at the limit
    assert [n for n, _ in iter_jsonl(path, max_line_bytes=18)] == [1, 2]
