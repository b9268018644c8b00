"""User docs state what is true now: no measurement history outside results.md and benchmarks.md.

README.md and docs/*.md are read by a stranger deciding whether to trust looprl. Who measured
what in which session, which commit, the load average of the day: that belongs in the benchmark
scripts' output and in docs/results.md / docs/benchmarks.md (current numbers, each with its
command and machine), not in the pages that say how looprl works.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HISTORY = re.compile(
    r"session [0-9]|this session|previous run|earlier (run|measurement|session)"
    r"|commit [0-9a-f]{7}|not rerun|load average|other jobs",
    re.IGNORECASE,
)
MEASUREMENT_PAGES = {"results.md", "benchmarks.md"}
README_MAX_LINES = 200


def user_docs() -> list[Path]:
    """README.md and every docs/*.md page except the two that hold measurements."""
    pages = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in MEASUREMENT_PAGES)
    return [ROOT / "README.md", *pages]


def history_phrases(path: Path) -> list[str]:
    """`file:line: phrase` for each phrase of measurement history in a markdown page."""
    hits = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for found in HISTORY.finditer(line):
            hits.append(f"{path.relative_to(ROOT)}:{number}: {found.group(0)!r}")
    return hits


def test_the_search_finds_each_kind_of_history(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text(
        "Session 6 measured it.\nIn this session we\nthe previous run\nan Earlier measurement\n"
        "from commit f48e5eb\n(not rerun since)\nload average 7\nwith other jobs\n"
        "a session id\ncommit often\nthe run before\n",
        encoding="utf-8",
    )
    assert [hit.split(":")[1] for hit in history_phrases(page)] == [str(n) for n in range(1, 9)]


def test_user_docs_hold_no_measurement_history():
    hits = [hit for path in user_docs() for hit in history_phrases(path)]
    assert not hits, (
        "measurement history in user docs; say what is true now, with the command that shows it, "
        "or move the number to docs/results.md or docs/benchmarks.md:\n" + "\n".join(hits)
    )


def test_readme_fits_on_a_few_screens():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}); move detail to docs/"
    )
