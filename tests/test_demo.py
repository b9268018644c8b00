"""Tier 3: `make demo`'s pipeline (SFT -> eval -> GRPO -> eval) end to end on a tiny budget."""

from __future__ import annotations

import json

import pytest

from looprl.cli.demo import main

pytestmark = pytest.mark.slow


def test_demo_runs_every_phase_on_a_tiny_budget(tmp_path, capsys):
    out = tmp_path / "demo"
    args = ["--out", str(out), "--sft-examples", "32", "--rl-steps", "1", "--eval-tasks", "3"]
    assert main([*args, "--eval-rollouts", "1"]) == 0
    printed = capsys.readouterr().out
    assert "accuracy, greedy" in printed and "accuracy gain from RL" in printed
    for name in ("eval_before", "eval_before_greedy", "eval_after", "eval_after_greedy"):
        meta = json.loads((out / name / "metadata.json").read_text())
        assert meta["summary"]["episodes"] == 3
    greedy = json.loads((out / "eval_after_greedy" / "metadata.json").read_text())
    assert greedy["sampling"]["temperature"] == 0.0
    assert (out / "grpo" / "final" / "config.json").exists()
    # `make demo` twice in a row: the second run starts over in the same directory
    assert main([*args, "--eval-rollouts", "1", "--rl-steps", "2"]) == 0
    steps = [
        json.loads(x)["step"] for x in (out / "grpo" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps[-1] == 2 and steps.count(1) == 1
