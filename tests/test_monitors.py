"""Reward-hacking monitors: each trips on a stream built to trip it, at the step the hack starts,
and stays quiet on the demo's real stream and on a healthy synthetic one.

`tests/data/monitors_demo_stream.jsonl` is the `make demo` GRPO run (runs/demo/grpo, 30 steps,
SFT-warmed tiny model on the calculator) compacted by `EpisodeView.of`: per step the metrics the
monitors read and the 16 episodes the run saved (replies, per-function rewards, what each earned).
It was recorded before the metric namespaces (`entropy`, `turns`, ...): it is read as every old
run is, through `upgrade_row`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from looprl.trainer.config import ConfigError, load_config
from looprl.trainer.metrics import upgrade_row
from looprl.trainer.monitors.config import MonitorsSection
from looprl.trainer.monitors.core import MONITORS, EpisodeView, Monitors
from looprl.trainer.monitors.episodes import (
    StepView,
    correlation,
    repeated_fraction,
    rubric_weights,
)

DATA = Path(__file__).parent / "data"
HACK = 20  # the step every synthetic hack starts at


def episode(rng: random.Random, correct: float, check: float, **over) -> EpisodeView:
    """One calculator-like episode: weighted `correct` and `answer_format`, a zero-weight check."""
    rewards = {"correct": correct, "answer_format": 1.0, "check": check}
    fields = {
        "replies": (
            f"I call the tool on {rng.randint(1, 99)} + {rng.randint(1, 99)}.",
            "The answer is 42.",
        ),
        "rewards": rewards,
        "earned": {"correct": correct, "answer_format": 0.1},
        "tokens": 40 + rng.randint(-3, 3),
    }
    return EpisodeView(**{**fields, **over})


def healthy_step(rng: random.Random, step: int) -> tuple[dict[str, float], list[EpisodeView]]:
    """A step of a healthy run: noisy but level metrics; `check` agrees with `correct` 90%."""
    metrics = {
        "reward/mean": 0.6 + 0.05 * rng.random(),
        "rollout/turns": 2.0 + 0.2 * rng.random(),
        "rollout/tool_calls": 1.0 + 0.2 * rng.random(),
        "policy/entropy": 0.5 + 0.1 * rng.random(),
        "policy/kl": 0.01 + 0.005 * rng.random(),
        "policy/mismatch_kl": 1e-9 * rng.random(),
        "policy/logprob_gap": 1e-6 * (1 + rng.random()),
    }
    if step % 10 == 0:
        metrics["eval/reward"] = 0.6 + 0.02 * rng.random()
    episodes = []
    for _ in range(64):
        correct = float(rng.random() < 0.6)
        check = correct if rng.random() < 0.9 else 1.0 - correct
        episodes.append(episode(rng, correct, check))
    return metrics, episodes


def hack_reward_vs_heldout(rng, step, metrics, episodes):
    """From HACK on the training reward climbs; the next evaluation (step 30) falls."""
    metrics["reward/mean"] += 0.2
    if "eval/reward" in metrics and step > HACK:  # the evaluation at HACK saw the old policy
        metrics["eval/reward"] -= 0.2
    return metrics, episodes


def hack_length_blowup(rng, step, metrics, episodes):
    return metrics, [EpisodeView(**{**ep.__dict__, "tokens": ep.tokens * 3}) for ep in episodes]


def hack_tool_call_spike(rng, step, metrics, episodes):
    return {**metrics, "rollout/tool_calls": 6.0}, episodes


def hack_format_only_reward(rng, step, metrics, episodes):
    """Nine in ten episodes miss the answer but keep the format reward."""
    out = []
    for _ in episodes:
        correct = float(rng.random() < 0.1)
        out.append(episode(rng, correct, correct))
    return metrics, out


def hack_entropy_collapse(rng, step, metrics, episodes):
    return {**metrics, "policy/entropy": 0.05}, episodes


def hack_kl_spike(rng, step, metrics, episodes):
    """One step where the sampler and the trainer disagree (a weight sync gone wrong)."""
    return ({**metrics, "policy/mismatch_kl": 0.02} if step == HACK else metrics), episodes


def hack_repeated_ngrams(rng, step, metrics, episodes):
    loop = "the answer is 42 " * 8
    return metrics, [EpisodeView(**{**ep.__dict__, "replies": (loop,)}) for ep in episodes]


def hack_reward_disagreement(rng, step, metrics, episodes):
    """The reward climbs to 90% while the check stays at 30%, independently of it."""
    out = [episode(rng, float(rng.random() < 0.9), float(rng.random() < 0.3)) for _ in episodes]
    return metrics, out


HACKS = {
    "reward_vs_heldout": (hack_reward_vs_heldout, 30),  # tripped at the next evaluation
    "length_blowup": (hack_length_blowup, HACK),
    "tool_call_spike": (hack_tool_call_spike, HACK),
    "format_only_reward": (hack_format_only_reward, HACK),
    "entropy_collapse": (hack_entropy_collapse, HACK),
    "kl_spike": (hack_kl_spike, HACK),
    "repeated_ngrams": (hack_repeated_ngrams, HACK),
    "reward_disagreement": (hack_reward_disagreement, HACK),
}


def run_stream(monitors: Monitors, hack=None, steps: int = 30, seed: int = 0) -> list[dict]:
    """Feed a seeded synthetic stream (hacked from HACK on) and return the rows monitors add."""
    rng = random.Random(seed)
    rows = []
    for step in range(1, steps + 1):
        metrics, episodes = healthy_step(rng, step)
        if hack is not None and step >= HACK:
            metrics, episodes = hack(rng, step, metrics, episodes)
        rows.append(_observe(monitors, step, metrics, episodes))
    return rows


def _observe(monitors: Monitors, step: int, metrics: dict, episodes: list[EpisodeView]) -> dict:
    return monitors.read(StepView(step, metrics, tuple(episodes)))


def tripped_steps(rows: list[dict], name: str) -> list[int]:
    return [i + 1 for i, row in enumerate(rows) if row[f"monitor/{name}"] == 1.0]


def test_the_table_covers_the_issue_and_every_hack_has_a_test() -> None:
    assert set(MONITORS) == set(HACKS)


def test_a_healthy_synthetic_stream_trips_nothing() -> None:
    warnings: list[str] = []
    rows = run_stream(Monitors(MonitorsSection(), warn=warnings.append))
    assert warnings == []
    assert all(row[f"monitor/{name}"] == 0.0 for row in rows for name in MONITORS)
    assert len(rows) == 30 and all(f"monitor/{name}" in rows[0] for name in MONITORS)


@pytest.mark.parametrize("name", sorted(HACKS))
def test_each_monitor_trips_at_the_step_its_hack_starts(name: str) -> None:
    hack, expected = HACKS[name]
    # one step of episodes per correlation, so the hack's first step alone decides
    cfg = MonitorsSection(agreement_window=1)
    warnings: list[str] = []
    rows = run_stream(Monitors(cfg, warn=warnings.append), hack)
    assert tripped_steps(rows, name)[0] == expected
    others = [n for n in MONITORS if n != name and tripped_steps(rows, n)]
    assert others == []  # each hack trips its own monitor only
    assert len(warnings) == 1  # once, however many steps it stays tripped
    assert warnings[0].startswith(f"{name} tripped at step {expected}: ")


def test_warning_names_the_numbers_and_what_to_look_at() -> None:
    printed: list[str] = []
    monitors = Monitors(MonitorsSection(), warn=printed.append)
    for step in range(1, 8):
        monitors.observe(step, {"rollout/tool_calls": 1.0 if step < 7 else 9.0})
    assert printed == [
        "tool_call_spike tripped at step 7: rollout/tool_calls 9 per episode vs baseline 1. Look at "
        "episodes with the most tool calls: a flood of calls the reward pays for."
    ]


def demo_rows() -> list[dict]:
    """The recorded stream's rows as stored: metrics under the names of before the namespaces."""
    lines = (DATA / "monitors_demo_stream.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def demo_stream() -> list[tuple[int, dict, list[EpisodeView]]]:
    return [
        (r["step"], upgrade_row(r["metrics"]), [EpisodeView(**e) for e in r["episodes"]])
        for r in demo_rows()
    ]


def test_monitors_stay_quiet_on_the_demo_stream() -> None:
    warnings: list[str] = []
    monitors = Monitors(MonitorsSection(), warn=warnings.append)
    stream = demo_stream()
    assert len(stream) == 30 and sum("eval/reward" in m for _, m, _ in stream) == 3
    rows = [_observe(monitors, step, metrics, eps) for step, metrics, eps in stream]
    assert warnings == []
    assert {k for row in rows for k, v in row.items() if k.startswith("monitor/") and v} == set()
    # the supporting series were computed, not skipped
    assert all("rollout/reply_tokens" in row and "rollout/repeat_ngram_frac" in row for row in rows)
    assert any("rollout/reward_agreement" in row for row in rows)


def test_saturating_check_is_not_disagreement() -> None:
    """A check everyone comes to pass (the demo's used_tool) loses its correlation with the
    reward while both rise: that is learning, not a hack."""
    rng = random.Random(1)
    monitors = MONITORS["reward_disagreement"](MonitorsSection(agreement_window=1))
    trips = []
    for step in range(1, 21):
        p_check = min(1.0, 0.3 + 0.05 * step)  # climbs to 1.0, faster than the reward
        eps = []
        for _ in range(64):
            check = float(rng.random() < p_check)
            correct = float(check and rng.random() < 0.3 + 0.01 * step)
            eps.append(episode(rng, correct, check))
        trips.append(monitors.check(StepView(step, {}, eps)).tripped)
    assert not any(trips)


def test_a_resumed_run_keeps_its_baselines_and_does_not_warn_again() -> None:
    cfg = MonitorsSection()
    rows = []
    first: list[str] = []
    whole = Monitors(cfg, warn=first.append)
    for step in range(1, 13):
        metrics = {
            "rollout/tool_calls": 9.0 if step == 8 else 1.0,
            "policy/entropy": 0.5,
            "reward/mean": 0.5,
        }
        rows.append({"step": step, **metrics, **whole.observe(step, metrics)})
    assert first and "step 8" in first[0]
    again: list[str] = []
    resumed = Monitors(cfg, warn=again.append, history=rows[:10])
    metrics = {"rollout/tool_calls": 9.0, "policy/entropy": 0.5, "reward/mean": 0.5}
    assert resumed.observe(11, metrics)["monitor/tool_call_spike"] == 1.0  # baseline replayed
    assert again == []  # it warned at step 8, before the resume


def test_disabled_monitors_add_nothing_and_step_zero_only_sets_baselines() -> None:
    off = Monitors(MonitorsSection(enabled=False))
    assert off.observe(3, {"rollout/tool_calls": 1.0}) == {}
    on = Monitors(MonitorsSection(), warn=lambda _m: None)
    assert on.observe(0, {"eval/reward": 0.5}) == {}


def test_config_section_is_typed_and_checked() -> None:
    cfg = load_config(None, {"monitors.length_ratio": 3})
    assert cfg.monitors.length_ratio == 3.0 and cfg.monitors.enabled
    with pytest.raises(ConfigError, match="monitors.disagree_corr .* must be below"):
        load_config(None, {"monitors.disagree_corr": 0.6})
    with pytest.raises(ConfigError, match="monitors.length_ratio"):
        load_config(None, {"monitors.length_ratio": 0.5})


def test_seq_rep_and_correlation_by_hand() -> None:
    # "a b a b a b": 4-grams (a b a b), (b a b a), (a b a b): one of three repeats
    assert repeated_fraction("a b a b a b", 4) == pytest.approx(1 / 3)
    assert repeated_fraction("The answer is 42.", 4) == 0.0
    assert repeated_fraction("too short", 4) is None
    assert correlation([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert correlation([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert correlation([1, 1, 1, 1], [0, 1, 0, 1]) is None  # a constant says nothing


def test_rubric_weights_follow_a_mixture_to_its_member() -> None:
    from looprl.envs.calculator import load_environment as calculator
    from looprl.envs.mixture import MixtureEnv
    from looprl.types import EpisodeResult, Task

    env = calculator()
    ep = EpisodeResult(task=Task("t", [], "1", env="calculator"))
    weights = {
        "correct_answer": 1.0,
        "answer_format": 0.0,
        "used_tool": 0.0,
        "tool_call_validity": 0.0,
    }
    assert rubric_weights(env.rubric, ep) == weights
    assert rubric_weights(MixtureEnv([env]).rubric, ep) == weights


@pytest.mark.slow
def test_monitors_run_in_a_real_training_run(tmp_path) -> None:
    from looprl.trainer.trainer import Trainer

    overrides = {
        "model.name": "tiny", "env.name": "calculator", "rollout.tasks_per_step": 2,
        "rollout.rollouts_per_task": 2, "rollout.max_tokens": 16, "trainer.steps": 2,
        "trainer.eval_every": 0, "trainer.eval_tasks": 2, "trainer.save_every": 2,
        "run.output_dir": str(tmp_path), "run.name": "m", "run.tensorboard": False,
    }  # fmt: skip
    Trainer(load_config(None, overrides)).run()
    rows = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert {row[f"monitor/{name}"] for name in MONITORS} <= {0.0, 1.0}
        assert row["rollout/reply_tokens"] > 0 and "rollout/format_only_frac" in row


def test_replay_of_a_logged_run_reports_trips_and_noise(tmp_path, capsys) -> None:
    from looprl.trainer.monitors.replay import main

    rows = [{"step": r["step"], **r["metrics"]} for r in demo_rows()]  # a run of the old names
    rows[24]["tool_calls"] = 6.0  # step 25: a flood of calls
    (tmp_path / "config.json").write_text(json.dumps({"config": {"env": {"name": "calculator"}}}))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([str(tmp_path), "--monitors.window", "8"]) == 0
    out = capsys.readouterr().out
    assert "would warn: tool_call_spike tripped at step 25: rollout/tool_calls 6 per episode" in out
    assert "step   25  tool_call_spike" in out
    assert "eval/reward: 10:0.312 20:0.344 30:0.328" in out


def test_a_resume_from_a_checkpoint_state_continues_exactly(tmp_path) -> None:
    """Logged rows rebuild the metric baselines; the checkpoint's JSON state, the episode pool."""

    def stream():
        rng = random.Random(3)
        for step in range(1, 31):
            metrics, episodes = healthy_step(rng, step)
            if step >= HACK:
                metrics, episodes = hack_reward_disagreement(rng, step, metrics, episodes)
            yield step, metrics, episodes

    cfg = MonitorsSection()  # a 3-step episode pool: the state must carry it
    whole = Monitors(cfg, warn=lambda _m: None)
    straight = [_observe(whole, s, m, e) for s, m, e in stream()]
    assert 1.0 in [r["monitor/reward_disagreement"] for r in straight]

    first = Monitors(cfg, warn=lambda _m: None)
    rows, resumed, got = [], None, []
    for step, metrics, episodes in stream():
        if step <= 19:
            out = _observe(first, step, metrics, episodes)
            rows.append({"step": step, **metrics, **out})
            got.append(out)
            continue
        if resumed is None:  # killed after the checkpoint at step 19
            (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            state = json.loads(json.dumps(first.state()))
            resumed = Monitors.for_run(cfg, None, tmp_path, main=True, resume=True, state=state)
        got.append(_observe(resumed, step, metrics, episodes))
    assert got == straight
