"""Non-finite numbers never reach the weights: a NaN step is skipped and counted, a few in a row
stop the run with one line, and NaN weights are never written to a checkpoint or `final/`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import read_metrics, small_config, small_model
from test_trainer_update import samples

from looprl.algorithms.presets import resolve_algorithm
from looprl.trainer import update as U
from looprl.trainer.config import OptimSection
from looprl.trainer.nonfinite import SKIPPED_KEY, NonFiniteGuard
from looprl.trainer.setup import make_optimizer, make_scheduler


def _nan_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every loss `train_on_batch` computes becomes NaN (its gradients NaN with it)."""
    real = U.policy_objective

    def nan_objective(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(U, "policy_objective", nan_objective)


def test_a_nan_loss_skips_the_step_and_leaves_the_weights(monkeypatch):
    _nan_loss(monkeypatch)
    model = small_model()
    optim = OptimSection(lr=1e-2, weight_decay=0.01)  # decay alone would move every weight
    opt = make_optimizer(model, None, optim)
    sched = make_scheduler(opt, optim, 4)
    ctx = U.UpdateContext(
        model=model, optimizer=opt, scheduler=sched,
        algo=resolve_algorithm("grpo", updates_per_batch=2), pad_id=0,
        device=torch.device("cpu"), temperature=1.0, micro_batch_tokens=64, grad_clip=1.0,
    )  # fmt: skip
    before = [p.detach().clone() for p in model.parameters()]
    stats = U.train_on_batch(ctx, samples(6))
    assert stats["nonfinite_skipped"] == 2.0  # both optimizer steps of the batch
    assert "grad_norm" not in stats  # no step taken, so no norm to average
    for a, b in zip(before, model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not opt.state  # Adam's moments and step count untouched
    assert sched.last_epoch == 1  # the schedule still advances once per batch


def test_a_finite_step_counts_no_skip():
    model = small_model()
    optim = OptimSection(lr=1e-2)
    opt = make_optimizer(model, None, optim)
    ctx = U.UpdateContext(
        model=model, optimizer=opt, scheduler=make_scheduler(opt, optim, 4),
        algo=resolve_algorithm("grpo"), pad_id=0, device=torch.device("cpu"),
        temperature=1.0, micro_batch_tokens=64, grad_clip=1.0,
    )  # fmt: skip
    stats = U.train_on_batch(ctx, samples(6))
    assert stats["nonfinite_skipped"] == 0.0 and stats["grad_norm"] > 0


def test_the_guard_stops_after_the_limit_in_a_row_only():
    guard = NonFiniteGuard(limit=2, steps_per_batch=1)
    guard.observe(1, {SKIPPED_KEY: 1.0})
    guard.observe(2, {SKIPPED_KEY: 0.0})  # a good step resets the count
    guard.observe(3, {SKIPPED_KEY: 1.0})
    with pytest.raises(SystemExit) as stop:
        guard.observe(4, {SKIPPED_KEY: 1.0})
    line = str(stop.value.code)
    assert line.startswith("error: step 4:") and " — " in line and "\n" not in line


def test_weights_with_nan_are_refused():
    model = small_model()
    NonFiniteGuard.check_weights([model, None], None, "the checkpoint")  # finite: no error
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("inf")
    with pytest.raises(SystemExit, match="the checkpoint was not written"):
        NonFiniteGuard.check_weights([model], None, "the checkpoint")


HUGE_REWARD_ENV = """
from looprl import EpisodeResult, Limits, Message, Rubric, SingleTurnEnv, Task


def huge(episode: EpisodeResult) -> float:
    return 1e39 if len(episode.messages[-1].content) % 2 else float("nan")


def load_environment(**kwargs) -> SingleTurnEnv:
    def tasks(n: int, seed: int) -> list[Task]:
        return [Task(id=f"t{i}", prompt=[Message(role="user", content="hi")]) for i in range(n)]

    return SingleTurnEnv(
        name="huge", rubric=Rubric([huge]), train_tasks=tasks, eval_tasks=tasks,
        limits=Limits(max_turns=1, max_tokens_per_turn=8),
    )
"""


@pytest.mark.slow
def test_a_run_with_huge_and_nan_rewards_records_errors_and_trains_on_none(tmp_path: Path):
    from looprl.trainer.trainer import Trainer

    env = tmp_path / "huge_env.py"
    env.write_text(HUGE_REWARD_ENV)
    cfg = small_config(tmp_path, "huge", **{"env.name": str(env), "trainer.steps": 1})
    trainer = Trainer(cfg)
    with pytest.raises(SystemExit) as stop:  # nothing could be scored, so nothing was trained
        trainer.run()
    assert "4 of 4 episodes were scoring errors" in str(stop.value.code)
    assert read_metrics(trainer.run_dir)[0]["rollout/scoring_errors"] == 4.0  # 2 tasks x 2
    saved = (trainer.run_dir / "rollouts" / "step_000001.jsonl").read_text().splitlines()
    errors = [json.loads(line)["errors"] for line in saved]
    assert errors and all(e and e[0]["kind"] == "scoring" for e in errors)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert not (trainer.run_dir / "final").exists()


@pytest.mark.slow
def test_nan_steps_in_a_row_stop_the_run_without_final(tmp_path: Path, monkeypatch):
    from looprl.trainer.trainer import Trainer

    _nan_loss(monkeypatch)
    cfg = small_config(tmp_path, "nan", **{"trainer.steps": 4, "trainer.max_nonfinite_steps": 2})
    trainer = Trainer(cfg)
    with pytest.raises(SystemExit) as stop:
        trainer.run()
    assert str(stop.value.code).startswith("error: step 2:")
    assert [r[SKIPPED_KEY] for r in read_metrics(trainer.run_dir)] == [1.0, 1.0]
    assert not (trainer.run_dir / "final").exists()
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
