"""vs_trl's `--looprl-ref`: looprl's side runs the ref's own script on the ref's code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import vs_trl


def test_the_looprl_side_runs_the_script_and_imports_of_the_given_code(monkeypatch, tmp_path):
    seen: list[tuple[list[str], Path]] = []

    def fake_run_json(cmd: list[str], spec: dict, tmp: Path, what: str, code: Path = vs_trl.ROOT):
        seen.append((cmd, code))
        return {"checkpoints": {}}

    monkeypatch.setattr(vs_trl, "run_json", fake_run_json)
    ref_code = tmp_path / "ref"
    spec: dict[str, Any] = {"save_every": 2, "steps": 2}
    vs_trl.run_side("looprl", spec, Path("python"), tmp_path, "a", ref_code)
    vs_trl.run_side("looprl", spec, Path("python"), tmp_path, "b")
    vs_trl.run_side("trl", spec, Path("python"), tmp_path, "c", ref_code)
    (ref_cmd, ref_at), (tree_cmd, tree_at), (trl_cmd, trl_at) = seen
    assert ref_cmd[1] == str(ref_code / "benchmarks" / "vs_trl.py") and ref_at == ref_code
    assert tree_cmd[1] == str(vs_trl.ROOT / "benchmarks" / "vs_trl.py") and tree_at == vs_trl.ROOT
    assert trl_cmd[1] == str(vs_trl.WORKER) and trl_at == vs_trl.ROOT  # TRL's side never moves


def test_a_ref_that_git_cannot_archive_is_named(tmp_path):
    from benchmarks.compare_ref import export_ref

    with pytest.raises(SystemExit, match="git archive no-such-ref failed"):
        export_ref("no-such-ref", tmp_path)


def test_the_flag_is_parsed():
    assert vs_trl.parse_args(["--looprl-ref", "324bd95"]).looprl_ref == "324bd95"
    assert vs_trl.parse_args([]).looprl_ref is None
