"""benchmarks/eval_by_kind.py: an evaluation's episodes grouped by a pattern in the question."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.eval_by_kind import by_kind, main


def write_results(path: Path, rows: list[tuple[str, float]]) -> Path:
    path.mkdir()
    lines = [
        json.dumps({"task": {"prompt": [{"role": "user", "content": q}]}, "reward": r})
        for q, r in rows
    ]
    (path / "results.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_episodes_are_counted_per_kind_and_a_miss_is_its_own_kind(tmp_path, capsys):
    rows = [("Calculate 6 / 3.", 1.0), ("Calculate 8 / 2.", 0.0), ("Calculate 2 * 3.", 1.0),
            ("Say hello.", 0.0), ("Calculate 4 / 4.", 0.5)]  # fmt: skip
    out = write_results(tmp_path / "eval", rows)
    assert by_kind(out / "results.jsonl", r" ([*/]) ") == {"*": (1, 1), "/": (1, 3), "?": (0, 1)}
    assert by_kind(out / "results.jsonl", r" ([*/]) ", threshold=0.5)["/"] == (2, 3)
    main([str(out), "--pattern", r" ([*/]) "])
    assert "/ | 3 | 0.333 | [" in capsys.readouterr().out


def test_a_directory_without_results_says_so(tmp_path):
    with pytest.raises(SystemExit, match="results.jsonl does not exist"):
        main([str(tmp_path), "--pattern", "(x)"])
