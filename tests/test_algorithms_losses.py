"""Policy losses, value loss and overlong handling against hand-computed numbers and invariants."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from looprl.algorithms import (
    POLICY_LOSSES,
    cispo,
    clipped_token,
    clipped_value_loss,
    gspo,
    mask_truncated,
    overlong_penalty,
    reinforce,
    sequence_mean,
)


def t(x: list) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def leaf(x: list) -> torch.Tensor:
    return t(x).requires_grad_(True)


def test_clipped_token_hand_numbers_and_clip_gradients() -> None:
    # ratios 1.1, 1.5, 0.5, 0.9 against old logprobs 0; last token is padding with a wild logprob.
    ratios = [1.1, 1.5, 0.5, 0.9]
    logprobs = leaf([[*(math.log(r) for r in ratios), 50.0]])
    old = torch.zeros(1, 5)
    adv = t([[1, 1, -1, -1, 1]])
    mask = t([[1, 1, 1, 1, 0]])
    loss, stats = clipped_token(logprobs, old, adv, mask, eps_low=0.2, eps_high=0.28)
    assert_close(loss, t([[-1.1, -1.28, 0.8, 0.9, 0.0]]))
    loss.sum().backward()
    # clipped high (A>0, r>1.28) and clipped low (A<0, r<0.8) get no gradient; padding neither.
    assert_close(logprobs.grad, t([[-1.1, 0.0, 0.0, 0.9, 0.0]]))
    assert stats["clip_frac_low"] == 0.25 and stats["clip_frac_high"] == 0.25
    assert stats["clip_frac"] == 0.5
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert (stats["ratio_min"], stats["ratio_max"]) == pytest.approx((0.5, 1.5))


def test_clipped_token_does_not_clip_the_pessimistic_side() -> None:
    # r = 1.5 with A < 0 and r = 0.5 with A > 0 are outside the range but keep their gradient.
    logprobs = leaf([[math.log(1.5), math.log(0.5)]])
    loss, stats = clipped_token(logprobs, torch.zeros(1, 2), t([[-1, 1]]), torch.ones(1, 2))
    assert_close(loss, t([[1.5, -0.5]]))
    loss.sum().backward()
    assert_close(logprobs.grad, t([[1.5, -0.5]]))
    assert stats["clip_frac"] == 0.0


def test_gspo_sequence_ratio_and_gradient() -> None:
    # trained log ratios 0.1, 0.3 (mean 0.2); the padding token must not enter the mean.
    logprobs = leaf([[-0.9, -0.7, 5.0]])
    old = t([[-1.0, -1.0, 0.0]])
    mask = t([[1, 1, 0]])
    s = math.exp(0.2)
    loss, stats = gspo(logprobs, old, t([[1, 1, 1]]), mask, eps_low=0.5, eps_high=0.5)
    assert_close(loss, t([[-s, -s, 0.0]]))
    sequence_mean(loss, mask).backward()
    # d/dlogp_t of -A * exp(mean_t log r_t) is -A * s / |y|
    assert_close(logprobs.grad, t([[-s / 2, -s / 2, 0.0]]))
    assert stats["ratio_mean"] == pytest.approx(s)


def test_gspo_matches_direct_sequence_formula_on_random_inputs() -> None:
    torch.manual_seed(0)
    logprobs = (-torch.rand(3, 6)).requires_grad_(True)
    old = logprobs.detach() + 0.05 * torch.randn(3, 6)
    mask = t([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 1, 0]])
    adv = t([0.5, -1.0, 2.0])[:, None].expand(3, 6)
    loss, _ = gspo(logprobs, old, adv, mask, eps_low=10.0, eps_high=10.0)  # no clipping
    sequence_mean(loss, mask).backward()
    lp = logprobs.detach().clone().requires_grad_(True)
    s = torch.exp(((lp - old) * mask).sum(1) / mask.sum(1))  # (B,)
    (-(s * adv[:, 0]).mean()).backward()
    assert_close(logprobs.grad, lp.grad)


def test_gspo_clips_whole_sequence_at_paper_range() -> None:
    logprobs = leaf([[-0.9, -0.7]])
    old = t([[-1.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, stats = gspo(logprobs, old, t([[1, 1]]), mask)  # s = e^0.2 > 1 + 4e-4
    assert_close(loss, t([[-(1 + 4e-4), -(1 + 4e-4)]]))
    loss.sum().backward()
    assert_close(logprobs.grad, torch.zeros(1, 2))
    assert stats["clip_frac_high"] == 1.0
    loss_neg, _ = gspo(logprobs, old, t([[-1, -1]]), mask)  # A < 0: pessimistic side, unclipped
    assert_close(loss_neg, t([[math.exp(0.2)] * 2]))


def test_cispo_hand_numbers_keeps_gradient_of_clipped_tokens() -> None:
    old = t([[-2.0, -3.0, -1.0]])
    ratios = [1.5, 8.0, 0.1]
    logprobs = leaf([[o + math.log(r) for o, r in zip(old[0].tolist(), ratios, strict=True)]])
    adv = t([[1, 1, -1]])
    loss, stats = cispo(logprobs, old, adv, torch.ones(1, 3), eps_low=1.0, eps_high=5.0)
    weights = [1.5, 6.0, 0.1]  # 8.0 capped at 1 + 5; no lower bound
    lp = logprobs.detach()[0].tolist()
    expected = [-w * a * x for w, a, x in zip(weights, [1, 1, -1], lp, strict=True)]
    assert_close(loss, t([expected]))
    loss.sum().backward()
    assert_close(logprobs.grad, t([[-1.5, -6.0, 0.1]]))  # -w * A, even for the capped token
    assert stats["clip_frac_high"] == pytest.approx(1 / 3) and stats["clip_frac_low"] == 0.0


def test_reinforce_hand_numbers() -> None:
    logprobs = leaf([[-0.5, -1.5, -9.0]])
    loss, stats = reinforce(logprobs, logprobs.detach(), t([[2, -1, 4]]), t([[1, 1, 0]]))
    assert_close(loss, t([[1.0, -1.5, 0.0]]))
    loss.sum().backward()
    assert_close(logprobs.grad, t([[-2.0, 1.0, 0.0]]))
    assert stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_zero_advantage_gives_zero_gradient(name: str) -> None:
    torch.manual_seed(1)
    logprobs = (-torch.rand(2, 5)).requires_grad_(True)
    old = logprobs.detach() + 0.1 * torch.randn(2, 5)
    loss, _ = POLICY_LOSSES[name](logprobs, old, torch.zeros(2, 5), torch.ones(2, 5),
                                  eps_low=0.2, eps_high=0.2)  # fmt: skip
    loss.sum().backward()
    assert_close(logprobs.grad, torch.zeros(2, 5))


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_on_policy_gradient_is_minus_advantage(name: str) -> None:
    # At ratio 1 every loss has gradient -A per token (the policy-gradient theorem).
    logprobs = leaf([[-1.0, -2.0, -0.5]])
    adv = t([[1.0, -2.0, 0.5]])
    loss, _ = POLICY_LOSSES[name](logprobs, logprobs.detach(), adv, torch.ones(1, 3),
                                  eps_low=0.2, eps_high=0.2)  # fmt: skip
    loss.sum().backward()
    assert_close(logprobs.grad, -adv)


def test_clipped_value_loss_hand_numbers() -> None:
    values = leaf([[1.0, 0.5, 1.0, 3.0]])
    old = t([[0.5, 0.5, 0.5, 0.0]])
    returns = t([[2.0, 0.0, 0.0, 0.0]])
    mask = t([[1, 1, 1, 0]])
    loss, stats = clipped_value_loss(values, old, returns, mask, clip=0.2)
    # token 0: V_clip = 0.7, max(1, 1.69) -> clipped branch (no grad); token 1: V = V_old;
    # token 2: V_clip = 0.7, max(1, 0.49) -> unclipped branch; token 3: padding.
    assert_close(loss, t([[0.845, 0.125, 0.5, 0.0]]))
    loss.sum().backward()
    assert_close(values.grad, t([[0.0, 0.5, 1.0, 0.0]]))
    assert stats["value_clip_frac"] == pytest.approx(1 / 3)
    assert stats["value_mean"] == pytest.approx(2.5 / 3)


def test_overlong_penalty_ramp() -> None:
    lengths = torch.tensor([10, 16, 18, 20, 25])
    assert_close(overlong_penalty(lengths, max_len=20, buffer=4), t([0, 0, -0.5, -1, -1]))
    assert_close(overlong_penalty(lengths, 20, 4, penalty=0.5), t([0, 0, -0.25, -0.5, -0.5]))
    assert_close(overlong_penalty(lengths, 20, 0), torch.zeros(5))
    with pytest.raises(ValueError, match="exceeds max_len"):
        overlong_penalty(lengths, 20, 30)


def test_mask_truncated() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    out = mask_truncated(mask, torch.tensor([False, True]))
    assert out.tolist() == [[1, 1, 0], [0, 0, 0]]
