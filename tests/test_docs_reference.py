"""The API reference builds from the docstrings, and every link in the README and docs/ resolves."""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _builder():
    spec = importlib.util.spec_from_file_location("api_build", ROOT / "docs" / "api" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"`|\*\*|\*|_(?=\W)|(?<=\W)_", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Anchors of the headings of a markdown file (repeats get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        found = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if found:
            base = slug(found.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """Links of a markdown file that leave the repository or point at no file or heading."""
    problems = []
    for target in LINK.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        where = f"{path.relative_to(ROOT)}: ({target})"
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
            problems.append(f"{where} points outside the repository; link a file in it")
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            problems.append(f"{where}: no such file {resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: no heading with anchor #{anchor} in {resolved.name}")
    return problems


def test_slugs_follow_github():
    assert slug("The environment author's kit") == "the-environment-authors-kit"
    assert slug("### `looprl sft` data format".lstrip("# ")) == "looprl-sft-data-format"
    assert slug("1. Tools") == "1-tools"
    assert slug("reasoning_gym") == "reasoning_gym"


def test_link_checker_finds_broken_links(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Real heading\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#real-heading) [self](#top) [gone](c.md) [bad](b.md#nope) [web](https://x.org)\n"
        "# Top\n```\n[in code](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    problems = broken_links(page)
    assert len(problems) == 3, problems
    assert "no such file" in problems[0] and "#nope" in problems[1] and "outside" in problems[2]


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_every_link_resolves_inside_the_repository(path):
    assert broken_links(path) == []


def test_api_reference_builds_for_the_public_api(tmp_path):
    build = _builder()
    pages = build.build(tmp_path)
    assert (tmp_path / "index.html").is_file()
    for page, name in zip(pages, build.PUBLIC_MODULES, strict=True):
        html = page.read_text(encoding="utf-8")
        assert page.is_file() and name in html
    types = (tmp_path / "looprl" / "types.html").read_text(encoding="utf-8")
    assert "EpisodeResult" in types and "num_tool_calls" in types
    assert "ScriptedEngine" in (tmp_path / "looprl" / "engines" / "scripted.html").read_text()


def test_api_reference_shows_no_empty_docstring():
    assert _builder().undocumented() == []


def test_undocumented_lists_bare_functions_and_record_fields(tmp_path, monkeypatch):
    (tmp_path / "bare_module.py").write_text(
        '"""A module."""\nfrom dataclasses import dataclass\n\n'
        "def bare(): pass\n\n"
        '@dataclass\nclass Rec:\n    """A record."""\n\n    x: int = 0\n    y: int = 0\n    """Why."""\n',
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    build = _builder()
    monkeypatch.setattr(build, "_is_ours", lambda module: True)
    assert build.undocumented(("bare_module",)) == ["bare_module.Rec.x", "bare_module.bare"]


def test_documented_imports_work():
    from looprl import Limits, ToolEnv, load_environment, split_of  # noqa: F401
    from looprl.eval.summary import evaluate, summarize  # noqa: F401
    from looprl.rendering import Renderer
    from looprl.rollout.loop import RolloutConfig  # noqa: F401
    from looprl.rubrics import Rubric  # noqa: F401
    from looprl.tools import ERROR_KINDS, ToolError, ToolReply  # noqa: F401
    from looprl.tools.schema import Hidden  # noqa: F401

    assert Renderer.__module__ == "looprl.rendering.renderer"


def test_environments_page_has_a_section_per_shipped_environment():
    from looprl.envs.registry import BUILTIN

    text = (ROOT / "docs" / "environments.md").read_text(encoding="utf-8")
    numbers = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    assert f"looprl ships {numbers[len(BUILTIN)]}:" in text
    headings = [line for line in text.splitlines() if line.startswith("### ")]
    for name in BUILTIN:
        assert any(name in h for h in headings) and f"`{name}`" in text.split("\n## ")[0], name
