"""Per-token policy versions in the loss: lags, the staleness bound, its metrics, and TIS per token.

Hand-built batches mix tokens sampled by several policy versions (what in-flight weight updates
produce); the expected numbers are worked out in the comments.
"""

from __future__ import annotations

import math

import pytest
import torch

from looprl.algorithms import resolve_algorithm
from looprl.algorithms.objective import policy_objective
from looprl.algorithms.staleness import (
    logprob_gap_by_lag,
    staleness_stats,
    token_lags,
    within_bound,
)
from looprl.trainer.batch import StalenessBound, collate, samples_from_groups
from looprl.trainer.config import ConfigError, load_config
from looprl.types import EpisodeResult, Task, Trajectory

# two sequences of 4 target tokens; the trainer trains version 5
VERSIONS = torch.tensor([[5, 4, 3, -1], [1, 5, 2, 4]])  # -1: off the mask (a prompt token)
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


def test_lags_bound_and_histogram_by_hand() -> None:
    lags = token_lags(VERSIONS, trained_version=5)
    # 5-5, 5-4, 5-3, unknown -> 0 ; 5-1, 5-5, 5-2, 5-4
    assert lags.tolist() == [[0, 1, 2, 0], [4, 0, 3, 1]]
    # bound 2 keeps lags 0..2: the lag-4 and lag-3 tokens of row 2 leave the loss
    assert within_bound(lags, MASK, 2).tolist() == [[1, 1, 1, 0], [0, 1, 0, 1]]
    stats = staleness_stats(lags, MASK)
    # 7 sampled tokens with lags 0,1,2 | 4,0,3,1: mean 11/7, max 4; lag 0: 2, 1: 2, 2: 1, 3+: 2
    assert stats["staleness_mean"] == pytest.approx(11 / 7)
    assert stats["staleness_max"] == 4.0
    fracs = [stats[f"staleness_frac_lag{b}"] for b in ("0", "1", "2", "3plus")]
    assert fracs == pytest.approx([2 / 7, 2 / 7, 1 / 7, 2 / 7])
    assert staleness_stats(lags, torch.zeros_like(MASK)) == {}


def test_logprob_gap_is_grouped_by_lag() -> None:
    lags = token_lags(VERSIONS, trained_version=5)  # [[0, 1, 2, 0], [4, 0, 3, 1]]
    trainer = torch.zeros(2, 4)
    sampler = torch.tensor([[-0.1, -0.3, 0.5, -9.0], [-2.0, 0.2, -1.0, -0.5]])
    gaps = logprob_gap_by_lag(trainer, sampler, lags, MASK)
    # lag 0: |0.1|, |0.2| (the masked -9 is left out); lag 1: 0.3, 0.5; lag 2: 0.5; 3+: 2.0, 1.0
    assert gaps["0"] == pytest.approx((0.15, 2.0))
    assert gaps["1"] == pytest.approx((0.4, 2.0))
    assert gaps["2"] == pytest.approx((0.5, 1.0))
    assert gaps["3plus"] == pytest.approx((1.5, 2.0))


def test_tis_weights_use_each_tokens_own_sampler_logprob() -> None:
    """The trainer's logprob is the same for every token; the samplers (versions) differ."""
    algo = resolve_algorithm("grpo", use_tis=True, tis_cap=2.0, aggregation="token_mean")
    old = torch.full((1, 3), -1.0)  # the trainer's weights on the three tokens
    # sampled by three versions: pi_sampler = e^-1 (same weights), e^-2 (older), e^-0.2
    sampler = torch.tensor([[-1.0, -2.0, -0.2]])
    loss, stats = policy_objective(
        algo, logprobs=old.clone().requires_grad_(), old_logprobs=old, sampler_logprobs=sampler,
        advantages=torch.ones(1, 3), mask=torch.ones(1, 3),
    )  # fmt: skip
    # TIS weight min(pi_trainer / pi_sampler, 2): e^0 = 1, e^1 -> capped at 2, e^-0.8
    weights = [1.0, 2.0, math.exp(-0.8)]
    assert stats["tis_weight_mean"] == pytest.approx(sum(weights) / 3)
    assert stats["tis_clip_frac"] == pytest.approx(1 / 3)
    # ratio pi / pi_old = 1 on every token, so each token's loss is -A * its own weight
    assert float(loss.detach()) == pytest.approx(-sum(weights) / 3)
    assert stats["logprob_gap"] == pytest.approx((0.0 + 1.0 + 0.8) / 3)


def test_recomputed_old_logprobs_are_the_trainers_whatever_the_version() -> None:
    """With several updates per batch, `old_logprobs` is the trainer's own forward before the
    update (the proximal policy): the PPO ratio is pi / pi_old on every token, whichever version
    sampled it, and only TIS reaches back to each token's sampler (AReaL's decoupled objective)."""
    algo = resolve_algorithm("grpo", use_tis=False, aggregation="token_mean")
    new = torch.tensor([[-0.9, -0.9]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0]])  # the same trainer logprob on both tokens
    for sampler in (torch.tensor([[-1.0, -1.0]]), torch.tensor([[-3.0, -0.1]])):
        _, stats = policy_objective(
            algo, logprobs=new, old_logprobs=old, sampler_logprobs=sampler,
            advantages=torch.ones(1, 2), mask=torch.ones(1, 2),
        )  # fmt: skip
        assert stats["ratio_mean"] == pytest.approx(math.exp(0.1))  # the sampler plays no part


def _episode(versions: list[int], reward: float, policy_version: int | None = 4) -> EpisodeResult:
    """One episode: two prompt tokens, then one sampled token per entry of `versions`."""
    seg = Trajectory()
    seg.extend([1, 2], sampled=False, turn=0)
    n = len(versions)
    seg.extend(list(range(3, 3 + n)), sampled=True, turn=0, logprobs=[-0.5] * n, versions=versions)
    ep = EpisodeResult(task=Task(id="t", prompt=[]), trajectories=[seg], reward=reward)
    ep.policy_version = policy_version
    return ep


def test_the_bound_masks_too_stale_tokens_and_drops_all_stale_episodes() -> None:
    algo = resolve_algorithm("grpo")
    group = [
        _episode([5, 4, 2], 1.0),  # lags 0, 1, 3 at trained version 5
        _episode([1, 2], 0.0),  # lags 4, 3: all too stale, dropped
        _episode([-1, 5], 0.0),  # -1: the engine named none, read as the episode's version 4
        _episode([3, 3], 1.0, policy_version=None),
    ]
    bound = StalenessBound(trained_version=5, max_staleness=2)
    samples, stats = samples_from_groups([group], algo, max_len=8, bound=bound)
    assert len(samples) == 3  # the all-stale episode left the group (and its baseline)
    assert [s.versions for s in samples] == [[-1, -1, 5, 4, 2], [-1, -1, 4, 5], [-1, -1, 3, 3]]
    assert [s.mask for s in samples] == [[0, 0, 1, 1, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    # the kept samples' 7 tokens have lags 0,1,3 | 1,0 | 2,2; the dropped episode's 2 tokens
    # and the lag-3 token are too stale
    assert stats["async/tokens_too_stale"] == 3.0
    assert stats["async/episodes_too_stale"] == 1.0
    assert stats["async/staleness_mean"] == pytest.approx(9 / 7)
    assert stats["async/staleness_frac_lag3plus"] == pytest.approx(1 / 7)
    # the advantages are those of the three-episode group (rewards 1, 0, 1)
    assert samples[1].advantage < 0 < samples[0].advantage == samples[2].advantage
    batch = collate(samples, pad_id=0, device="cpu")  # versions shifted like the targets
    assert batch.versions is not None
    assert batch.versions[0].tolist() == [-1, 5, 4, 2] and batch.versions[1].tolist()[-1] == -1


def test_within_the_bound_the_samples_are_the_unbounded_ones() -> None:
    algo = resolve_algorithm("grpo")
    group = [_episode([5, 4], 1.0), _episode([3, 4], 0.0)]
    plain, plain_stats = samples_from_groups([group], algo, max_len=8)
    bounded, stats = samples_from_groups([group], algo, max_len=8, bound=StalenessBound(5, 2))
    assert bounded == plain and not any(k.startswith("async/") for k in plain_stats)
    assert stats["async/tokens_too_stale"] == 0.0 and stats["async/staleness_max"] == 2.0


def test_trajectory_versions_round_trip_and_old_data_reads_as_unknown() -> None:
    seg = _episode([5, 4], 1.0).trajectories[0]
    assert seg.versions == [-1, -1, 5, 4]
    again = Trajectory.from_dict(seg.to_dict())
    assert again == seg
    old = {k: v for k, v in seg.to_dict().items() if k != "versions"}  # written before versions
    read = Trajectory.from_dict(old)
    read.check()
    assert read.versions == []
    ep = EpisodeResult(task=Task(id="t", prompt=[]), trajectories=[read], policy_version=2)
    samples, _ = samples_from_groups([[ep, _episode([2, 2], 0.0)]], resolve_algorithm("grpo"), 8)
    assert samples[0].versions == [-1, -1, 2, 2]  # the episode's version on every sampled token


def test_bad_versions_are_refused_with_the_fix() -> None:
    seg = Trajectory()
    with pytest.raises(ValueError, match="one version each"):
        seg.extend([1, 2], sampled=True, turn=0, logprobs=[-1.0, -1.0], versions=[3])
    seg.extend([1, 2], sampled=True, turn=0, logprobs=[-1.0, -1.0])  # None: -1, unknown
    assert seg.versions == [-1, -1]
    seg.versions[0] = 7
    seg.mask[0] = 0
    seg.logprobs[0] = 0.0
    with pytest.raises(ValueError, match="version is set on a token with mask 0"):
        seg.check()
    seg.versions.append(1)
    with pytest.raises(ValueError, match="lists differ in length"):
        seg.check()
    with pytest.raises(ConfigError, match="max_staleness"):
        load_config(None, {"trainer.max_staleness": -1})
    cfg = load_config(None, {"trainer.max_async_steps": 2})
    assert cfg.trainer.staleness_bound == 2
    assert load_config(None, {"trainer.max_staleness": 0}).trainer.staleness_bound == 0
