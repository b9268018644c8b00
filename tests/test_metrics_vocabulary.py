"""Metric names are declared once: a real run emits only declared names, and the docs list them all."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from looprl.trainer.config import load_config
from looprl.trainer.metrics import METRICS, declared
from looprl.trainer.trainer import Trainer

ROOT = Path(__file__).parent.parent
LENGTH_ENV = str(Path(__file__).parent / "envs" / "length_env.py")


def test_docs_list_exactly_the_declared_metrics() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE)
    assert listed == list(METRICS)


def test_patterns_match_their_instances_only() -> None:
    assert declared("reward/correct_answer") and declared("eval/pass@4")
    assert declared("env/calculator/reward") and declared("time/eval")
    assert not declared("adv/mean") and not declared("reward") and not declared("nosuch")


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["grpo", "ppo"])
def test_a_one_step_run_emits_only_declared_metrics(tmp_path, preset) -> None:
    overrides = {
        "model.name": "tiny", "env.name": LENGTH_ENV, "rollout.tasks_per_step": 2,
        "rollout.rollouts_per_task": 2, "trainer.steps": 1, "trainer.eval_every": 1,
        "trainer.eval_before": True, "trainer.eval_tasks": 2, "trainer.save_every": 1,
        "run.output_dir": str(tmp_path), "run.name": preset, "run.tensorboard": False,
        "algorithm.preset": preset, "algorithm.overrides": {"kl_coef": 0.01},
    }  # fmt: skip
    Trainer(load_config(None, overrides)).run()
    rows = [json.loads(x) for x in (tmp_path / preset / "metrics.jsonl").read_text().splitlines()]
    keys = {k for row in rows for k in row}
    assert not sorted(k for k in keys if not declared(k))
    assert {"reward/mean", "loss", "kl", "eval/reward", "eval/pass@1", "time/eval"} <= keys
