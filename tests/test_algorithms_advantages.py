"""Advantage estimators and GAE against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from looprl.algorithms import (
    ADVANTAGES,
    batch_whitened,
    broadcast_to_tokens,
    gae,
    group_mean,
    group_normalized,
    leave_one_out,
    terminal_rewards,
    zero_variance_groups,
)


def t(x: list) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def test_group_normalized_hand_numbers() -> None:
    adv = group_normalized(t([[1, 0, 0, 1], [2, 2, 2, 2]]))
    a = 0.5 / math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1) is sqrt(1/3)
    assert_close(adv, t([[a, -a, -a, a], [0, 0, 0, 0]]), atol=1e-5, rtol=0)


def test_group_mean_hand_numbers() -> None:
    assert_close(group_mean(t([[3, 1, 2], [0, 0, 6]])), t([[1, -1, 0], [-2, -2, 4]]))


def test_leave_one_out_hand_numbers() -> None:
    assert_close(leave_one_out(t([[1, 0, 0, 1]])), t([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))
    assert_close(leave_one_out(t([[3, 1, 2]])), t([[1.5, -1.5, 0.0]]))


def test_batch_whitened_hand_numbers() -> None:
    # centred [[.5, -.5], [0, 0]]; batch std (unbiased over 4 values) = sqrt(0.5 / 3)
    a = 0.5 / math.sqrt(0.5 / 3)
    assert_close(batch_whitened(t([[1, 0], [3, 3]])), t([[a, -a], [0, 0]]), atol=1e-5, rtol=0)


def test_batch_whitened_all_uniform_is_zero_not_nan() -> None:
    assert_close(batch_whitened(t([[1, 1], [0, 0]])), torch.zeros(2, 2))


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_advantages_need_two_rollouts_per_group(name: str) -> None:
    with pytest.raises(ValueError, match="G >= 2"):
        ADVANTAGES[name](t([[1.0], [0.0]]))


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_uniform_group_has_zero_advantage(name: str) -> None:
    adv = ADVANTAGES[name](t([[0.7, 0.7, 0.7], [1, 0, 0]]))
    assert_close(adv[0], torch.zeros(3))
    assert adv[1, 0] > 0 > adv[1, 1]


def test_zero_variance_groups() -> None:
    mask = zero_variance_groups(t([[1, 1, 1], [0, 1, 0], [0, 0, 0]]))
    assert mask.tolist() == [True, False, True]


def test_broadcast_and_terminal_rewards() -> None:
    mask = t([[1, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1]])
    assert_close(broadcast_to_tokens(t([2, 3, 4]), mask), mask * t([2, 3, 4])[:, None])
    expected = torch.zeros(3, 6)
    expected[0, 3] = 2.0  # last trained token of row 0
    expected[2, 5] = 4.0  # row 1 has no trained token: no reward anywhere
    assert_close(terminal_rewards(t([2, 3, 4]), mask), expected)


def test_gae_gamma_lam_one_zero_values_is_reward_to_go_on_trained_tokens() -> None:
    mask = t([[1, 1, 0, 0, 1, 1, 0]])
    rewards = t([[0, 0.5, 7.0, 0, 0, 1, 0]])  # 7.0 sits on an env token: ignored
    adv, ret = gae(rewards, torch.zeros(1, 7), mask, gamma=1.0, lam=1.0)
    assert_close(adv, t([[1.5, 1.5, 0, 0, 1, 1, 0]]))
    assert_close(ret, adv)


def test_gae_skips_env_tokens_hand_numbers() -> None:
    # trained tokens at 0, 2, 3; token 1 is tool output whose value (9.0) must not be used.
    mask = t([[1, 0, 1, 1]])
    values = t([[0.5, 9.0, 0.2, 0.4]])
    rewards = t([[0, 0, 0, 1]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    a3 = 1 - 0.4  # delta at the last trained token, no bootstrap
    a2 = (0.9 * 0.4 - 0.2) + 0.72 * a3
    a0 = (0.9 * 0.2 - 0.5) + 0.72 * a2  # bootstrap from token 2, not token 1
    assert_close(adv, t([[a0, 0, a2, a3]]))
    assert_close(ret, t([[a0 + 0.5, 0, a2 + 0.2, a3 + 0.4]]))


def test_gae_rows_are_independent_and_padding_is_zero() -> None:
    mask = t([[1, 1, 0], [0, 0, 0]])
    adv, ret = gae(t([[0, 1, 0], [5, 5, 5]]), t([[0.25, 0.5, 3.0], [1, 1, 1]]), mask)
    assert_close(adv, t([[0.75, 0.5, 0], [0, 0, 0]]))
    assert_close(ret, t([[1, 1, 0], [0, 0, 0]]))
    assert not adv.requires_grad
