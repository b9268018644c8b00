"""KL estimators, TIS weights, mismatch KL, and logprobs / entropy from logits."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from looprl.algorithms import (
    entropy_from_logits,
    kl_k1,
    kl_k3,
    logprobs_from_logits,
    mismatch_kl,
    truncated_importance_weights,
)


def t(x: list) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def test_k1_k3_hand_numbers() -> None:
    logprobs = t([[-1.0, -2.0, 0.0]])
    ref = t([[-1.5, -1.0, 0.0]])
    assert_close(kl_k1(logprobs, ref), t([[0.5, -1.0, 0.0]]))
    # k3 = e^x - 1 - x with x = ref - logp: x = -0.5 and x = 1
    assert_close(kl_k3(logprobs, ref), t([[math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]]))


def test_kl_mask_zeroes_padding_even_when_wild() -> None:
    logprobs = t([[-1.0, -500.0]])
    ref = t([[-1.0, 0.0]])
    out = kl_k3(logprobs, ref, mask=t([[1, 0]]))
    assert_close(out, t([[0.0, 0.0]]))
    assert torch.isfinite(kl_k3(logprobs, ref)).all()  # clamped, not inf


def test_k3_gradient_matches_analytic() -> None:
    logprobs = t([[-1.0, -2.0]]).requires_grad_(True)
    ref = t([[-1.5, -1.0]])
    kl_k3(logprobs, ref).sum().backward()
    # d/dlogp (e^(ref-logp) - 1 - (ref-logp)) = 1 - e^(ref-logp)
    assert_close(logprobs.grad, t([[1 - math.exp(-0.5), 1 - math.e]]))


def test_truncated_importance_weights_cap_and_detached() -> None:
    old = t([[-1.0, -1.0, -1.0]]).requires_grad_(True)
    sampler = t([[-1.5, -0.5, -3.0]])
    w = truncated_importance_weights(old, sampler, cap=2.0)
    assert_close(w, t([[math.exp(0.5), math.exp(-0.5), 2.0]]))
    assert not w.requires_grad


def test_mismatch_kl_mean_over_trained_tokens() -> None:
    trainer = t([[-1.0, -2.0, 99.0]])
    sampler = t([[-1.5, -2.0, 0.0]])
    value = mismatch_kl(trainer, sampler, t([[1, 1, 0]]))
    assert value.dim() == 0
    assert float(value) == pytest.approx((math.exp(0.5) - 1.5) / 2, rel=1e-6)  # k3 at x = 0.5, 0


def test_entropy_hand_numbers() -> None:
    logits = torch.log(t([[[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3]]]))
    expected = t([[0.5 * math.log(2) + 0.5 * math.log(4), math.log(3)]])
    assert_close(entropy_from_logits(logits), expected)


def test_entropy_chunked_matches_reference_value_and_gradient() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    out = entropy_from_logits(logits, temperature=0.7, chunk_size=4)
    ref_logits = logits.detach().clone().requires_grad_(True)
    ref = torch.distributions.Categorical(logits=ref_logits / 0.7).entropy()
    assert_close(out, ref)
    (out * torch.arange(5.0)).sum().backward()
    (ref * torch.arange(5.0)).sum().backward()
    assert_close(logits.grad, ref_logits.grad)


def test_logprobs_from_logits_hand_numbers() -> None:
    logits = t([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    ids = torch.tensor([[1, 0]])
    assert_close(logprobs_from_logits(logits, ids), t([[math.log(0.75), math.log(0.25)]]))
    # temperature 2: probabilities 1 : sqrt(3)
    out = logprobs_from_logits(logits, ids, temperature=2.0)
    s3 = math.sqrt(3.0)
    assert_close(out, t([[math.log(s3 / (1 + s3)), -math.log(1 + s3)]]))


def test_logprobs_chunked_matches_log_softmax_value_and_gradient() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 13, requires_grad=True)
    ids = torch.randint(0, 13, (2, 7))
    out = logprobs_from_logits(logits, ids, temperature=1.3, chunk_size=3)
    ref_logits = logits.detach().clone().requires_grad_(True)
    ref = torch.log_softmax(ref_logits / 1.3, dim=-1).gather(-1, ids[..., None]).squeeze(-1)
    assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    assert_close(logits.grad, ref_logits.grad)
    with torch.no_grad():
        assert_close(logprobs_from_logits(logits, ids, 1.3, chunk_size=3), ref.detach())
