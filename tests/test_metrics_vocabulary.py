"""Metric names are declared once: a real run emits only declared names, and the docs list them all."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from looprl.trainer.config import ConfigError, load_config
from looprl.trainer.metrics import METRICS, OLD_NAMES, declared, update_metrics, upgrade_row
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


def test_every_key_but_the_loggers_own_has_a_namespace() -> None:
    namespaces = {"reward", "env", "rollout", "loss", "policy", "value", "train", "time"}
    namespaces |= {"eval", "monitor", "async", "stream", "curriculum"}
    bare = [k for k in METRICS if "/" not in k]
    assert bare == ["step", "wall_time"]
    assert {k.split("/")[0] for k in METRICS if "/" in k} == namespaces


def test_old_names_map_one_to_one_onto_declared_keys() -> None:
    assert all(declared(new) for new in OLD_NAMES.values())
    assert len(set(OLD_NAMES.values())) == len(OLD_NAMES)  # no two old names merge
    assert not any(declared(old) for old in OLD_NAMES)  # an old row is never half renamed
    row = {"step": 3, "wall_time": 1.5, "loss": 0.2, "kl": 0.01, "turns": 2.0, "reward/mean": 1.0}
    assert upgrade_row(row) == {
        "step": 3, "wall_time": 1.5, "loss/total": 0.2, "policy/kl": 0.01,
        "rollout/turns": 2.0, "reward/mean": 1.0,
    }  # fmt: skip
    assert upgrade_row(upgrade_row(row)) == upgrade_row(row)  # a new row passes unchanged


def test_update_statistics_take_their_keys_and_an_undeclared_one_is_refused() -> None:
    out = update_metrics(
        {"loss": 0.5, "pg_loss": 0.4, "grad_norm": 2.0, "forward_tokens": 30.0}, 3.0
    )
    assert out == {
        "loss/total": 0.5, "loss/pg": 0.4, "train/grad_norm": 2.0, "train/forward_tokens": 30.0,
        "time/train": 3.0, "train/tokens_per_s": 10.0,
    }  # fmt: skip
    with pytest.raises(
        ValueError, match=r"\['new_stat'\] have no metric key: add each to OLD_NAMES"
    ):
        update_metrics({"new_stat": 1.0}, 1.0)


def test_a_config_naming_a_metric_is_checked_and_an_old_name_refused_with_its_new_one() -> None:
    ok = load_config(
        None, {"trainer.early_stop_metric": "policy/kl", "trainer.early_stop_value": 1}
    )
    assert ok.trainer.early_stop_metric == "policy/kl"
    old = {"trainer.early_stop_metric": "kl", "trainer.early_stop_value": 1.0}
    with pytest.raises(ConfigError, match="'kl' is the old name of a metric; write 'policy/kl'"):
        load_config(None, old)
    with pytest.raises(ConfigError, match="monitors.heldout_metric: .*'accuracy' is not a metric"):
        load_config(None, {"monitors.heldout_metric": "accuracy"})


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
    assert {"reward/mean", "loss/total", "policy/kl", "eval/reward", "eval/pass@1"} <= keys
    assert {"time/eval", "train/grad_norm", "rollout/turns", "monitor/kl_spike"} <= keys
    assert ("value/mean" in keys) == (preset == "ppo")
