"""docs/environments.md's "An offline judge in tests" recipe runs as written, with no server."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "environments.md"


def _block(marker: str) -> str:
    """The doc's ```python block that contains `marker`."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"expected one ```python block with {marker!r} in {DOC.name}"
    return found[0]


def test_offline_judge_recipe_runs_every_test_it_shows(tmp_path, monkeypatch):
    (tmp_path / "capitals.py").write_text(_block('"""capitals:'), encoding="utf-8")
    (tmp_path / "test_capitals.py").write_text(_block('"""test_capitals.py'), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("capitals", "test_capitals"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    recipe = importlib.import_module("test_capitals")
    tests = {n: f for n, f in vars(recipe).items() if n.startswith("test_") and callable(f)}
    assert len(tests) == 3, sorted(tests)
    for name, test in tests.items():
        assert inspect.iscoroutinefunction(test), name
        asyncio.run(test())  # each recipe test asserts the judge's reward or its scoring error
