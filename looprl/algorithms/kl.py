"""KL estimators and sampler/trainer mismatch corrections (TIS, mismatch KL).

All functions work per token on (B, T) tensors. Sampled-token KL estimators follow Schulman,
"Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html); truncated
importance sampling (TIS) follows Yao et al., "Your efficient RL framework secretly brings you
off-policy RL training" (2025), as adopted by veRL and others. Logprobs and entropy from logits
live in `logprobs.py`.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class KLFn(Protocol):
    """A per-token KL estimator, an entry of KL_ESTIMATORS: (B, T) tensors -> (B, T), 0 off mask."""

    def __call__(
        self, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor | None = None
    ) -> Tensor: ...


_LOG_RATIO_CLAMP = 20.0  # keeps exp() finite when two policies disagree wildly on a token


def _masked(x: Tensor, mask: Tensor | None) -> Tensor:
    """x with 0 where mask is 0 (no-op without a mask)."""
    return x if mask is None else torch.where(mask > 0, x, 0.0)


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor | None = None) -> Tensor:
    """k1 = log pi - log pi_ref per token: unbiased for KL(pi || pi_ref) on tokens sampled from pi.

    High variance and negative on some tokens; (B, T), 0 where mask is 0.
    """
    return _masked(logprobs - ref_logprobs, mask)  # (B, T)


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor | None = None) -> Tensor:
    """k3 = r - 1 - log r with r = pi_ref / pi per token: unbiased for KL(pi || pi_ref), always >= 0.

    The estimator GRPO uses (arXiv:2402.03300, eq. 4). Departure: log r is clamped to +-20 so a
    wild token cannot overflow. (B, T), 0 where mask is 0.
    """
    log_r = (ref_logprobs - logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # (B, T)
    return _masked(torch.exp(log_r) - 1.0 - log_r, mask)  # (B, T)


KL_ESTIMATORS: dict[str, KLFn] = {"k1": kl_k1, "k3": kl_k3}


@torch.no_grad()
def truncated_importance_weights(
    trainer_old_logprobs: Tensor, sampler_logprobs: Tensor, cap: float = 2.0
) -> Tensor:
    """TIS weights min(pi_trainer / pi_sampler, cap) per token, detached: (B, T).

    The sampler (vLLM, a batched KV-cache engine) and the trainer compute slightly different
    probabilities for the same weights; multiplying the policy loss by these weights corrects
    the bias, and the cap bounds the variance. Departure: the log ratio is clamped to +-20.
    """
    log_w = (trainer_old_logprobs - sampler_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return torch.exp(log_w).clamp(max=cap)  # (B, T)


@torch.no_grad()
def mismatch_kl(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> Tensor:
    """k3 estimate of KL(sampler || trainer), averaged over trained tokens: a 0-dim metric.

    Tokens were drawn from the sampler, so r = pi_trainer / pi_sampler. Near 0 when both agree;
    a rising value means the engine and the trainer disagree (precision, kernels, stale weights).
    """
    k3 = kl_k3(sampler_logprobs, trainer_logprobs, mask)  # (B, T)
    return k3.sum() / mask.float().sum().clamp(min=1.0)  # ()
