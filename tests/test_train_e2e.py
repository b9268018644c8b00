"""Tier 3: the trainer on the tiny model: every preset takes a step, resume is exact, logprobs agree."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import LENGTH_ENV, read_metrics, small_config, stable

from looprl.algorithms.presets import PRESETS
from looprl.trainer.trainer import Trainer

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_two_steps_change_weights_for_every_preset(tmp_path, preset):
    overrides = {"algorithm.preset": preset}
    if preset == "dapo":
        overrides["rollout.max_refill_rounds"] = 0
    cfg = small_config(tmp_path, preset, **overrides)
    trainer = Trainer(cfg)
    trainer._setup()
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.resume = True  # _setup already ran; run() would redo it, so drive the loop directly
    import asyncio

    last = asyncio.run(trainer._loop())
    trainer.logger.close()
    changed = any(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())
    rows = read_metrics(trainer.run_dir)
    assert len(rows) == 2 and all(
        math.isfinite(r["loss/total"]) for r in rows if r.get("loss/total") is not None
    )
    assert changed, "a training step left the weights unchanged"
    assert any(r.get("train/adv_abs_mean", 0.0) > 0 for r in rows)
    assert (trainer.run_dir / "final" / "config.json").exists()
    assert "reward/mean" in last


def test_trainer_logprobs_match_engine(tmp_path):
    """Mismatch KL between sampler and trainer is ~0 when they share weights (CPU, fp32)."""
    cfg = small_config(tmp_path, "mismatch", **{"trainer.steps": 1, "optim.lr": 1e-12})
    trainer = Trainer(cfg)
    trainer.run()
    row = read_metrics(trainer.run_dir)[0]
    assert row["policy/mismatch_kl"] < 1e-6


def test_eval_before_logs_the_starting_point(tmp_path):
    """`trainer.eval_before` evaluates the untouched model as step 0, on the same held-out tasks."""
    cfg = small_config(tmp_path, "before", **{"trainer.steps": 1, "trainer.eval_before": True})
    Trainer(cfg).run()
    rows = read_metrics(tmp_path / "before")
    assert [r["step"] for r in rows] == [0, 1]
    assert "eval/reward" in rows[0] and "loss/total" not in rows[0]
    assert "eval/reward" in rows[1] and "loss/total" in rows[1]
    assert (tmp_path / "before" / "eval" / "step_000000" / "results.jsonl").stat().st_size > 0


def test_resume_after_crash_reproduces_metrics(tmp_path, monkeypatch):
    full = small_config(tmp_path, "full", **{"trainer.steps": 4, "trainer.save_every": 2})
    Trainer(full).run()
    expected = [stable(r) for r in read_metrics(tmp_path / "full")]

    crash = small_config(tmp_path, "crash", **{"trainer.steps": 4, "trainer.save_every": 2})
    original = Trainer._save_rollouts

    def crash_at_step_3(self, step, groups):
        original(self, step, groups)
        if step == 3:
            raise KeyboardInterrupt("simulated kill after step 3 was logged but not checkpointed")

    monkeypatch.setattr(Trainer, "_save_rollouts", crash_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        Trainer(crash).run()
    monkeypatch.setattr(Trainer, "_save_rollouts", original)
    Trainer(crash, resume=True).run()
    got = [stable(r) for r in read_metrics(tmp_path / "crash")]
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert got == expected
    assert any(
        r["train/grad_norm"] > 0 for r in got
    )  # real updates happened, so equality means something


def test_kill_9_and_resume_from_cli(tmp_path):
    args = [
        sys.executable, "-m", "looprl.cli.main", "train", "--run-dir", str(tmp_path / "run"),
        "--model.name", "tiny", "--env.name", LENGTH_ENV,
        "--rollout.tasks_per_step", "2", "--rollout.rollouts_per_task", "2", "--trainer.steps", "6",
        "--trainer.save_every", "2", "--trainer.eval_every", "0", "--trainer.eval_tasks", "2",
        "--run.tensorboard", "false",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002" / "COMPLETE"
    deadline = time.time() + 240
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ckpt.exists()
    done = subprocess.run([*args, "--resume"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    resumed = [stable(r) for r in read_metrics(tmp_path / "run")]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    straight = subprocess.run([a if a != str(tmp_path / "run") else str(tmp_path / "straight") for a in args],
                              capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert straight.returncode == 0
    assert resumed == [stable(r) for r in read_metrics(tmp_path / "straight")]


def test_a_second_run_into_a_used_directory_is_refused_and_changes_nothing(tmp_path, capsys):
    from looprl.cli.main import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "config.json").write_text("the earlier run's config")
    code = main(["train", "--run-dir", str(run), "--model.name", "tiny", "--env.name", LENGTH_ENV])
    assert code == 2
    out = " ".join(capsys.readouterr().err.split())  # one line on stderr
    assert "already holds a training run" in out and "--resume" in out and "--run.name" in out
    assert (run / "config.json").read_text() == "the earlier run's config"
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
