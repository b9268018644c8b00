"""Tier 1: pass@k, summaries, and the results file (resume and repair)."""

from __future__ import annotations

import math

import pytest

from looprl.eval.summary import ResultsWriter, load_results, pass_at_k, summarize
from looprl.types import EpisodeResult, Message, Task, Trajectory


def test_pass_at_k_hand_numbers():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - (3 / 4) * (2 / 3))  # 0.5
    assert pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - math.comb(3, 3) / math.comb(5, 3))
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def _ep(tid: str, reward: float, i: int, **kw) -> EpisodeResult:
    traj = Trajectory()
    traj.extend([1, 2], sampled=False, turn=0)
    traj.extend([3, 4, 5], sampled=True, turn=0, logprobs=[-1.0] * 3)
    task = Task(id=tid, prompt=[Message(role="user", content="q")])
    return EpisodeResult(
        task=task,
        trajectories=[traj],
        reward=reward,
        rewards={"r": reward},
        rollout_index=i,
        num_turns=2,
        **kw,
    )


def test_summary_counts_errors_and_excludes_them_from_reward():
    eps = [
        _ep("a", 1.0, 0),
        _ep("a", 0.0, 1),
        _ep("b", 0.0, 0),
        _ep("b", 0.0, 1, errors=[{"kind": "scoring", "message": "x"}]),
    ]
    eps[2].tool_errors = {"timeout": 2}
    eps[2].truncated = True
    s = summarize(eps, rollouts_per_task=2, generate_seconds=2.0)
    assert s["scored_episodes"] == 3 and s["reward_mean"] == pytest.approx(1 / 3)
    assert s["pass_at_k"]["pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert s["pass_at_k"]["pass@2"] == pytest.approx(1.0)  # only task a has 2 scored samples
    assert s["tool_errors"] == {"timeout": 2} and s["truncated"] == 1 and s["scoring_errors"] == 1
    assert s["tokens_per_second"] == pytest.approx(12 / 2.0)
    assert s["error_messages"] and "scoring" in s["error_messages"][0]


def test_results_file_repair_keeps_complete_lines(tmp_path):
    path = tmp_path / "results.jsonl"
    writer = ResultsWriter(path)
    writer.write_group([_ep("a", 1.0, 0), _ep("a", 0.0, 1)])
    with path.open("a") as f:
        f.write('{"task": {"id": "b", "pro')  # a write cut by a kill
    eps, bad = load_results(path, repair=True)
    assert len(eps) == 2 and bad == 1
    assert path.read_text().endswith("\n") and len(path.read_text().splitlines()) == 2
    writer.write_group([_ep("b", 1.0, 0)])
    eps, bad = load_results(path)
    assert len(eps) == 3 and bad == 0
