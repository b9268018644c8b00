"""Per-token policy losses: clipped token ratio (PPO/GRPO/DAPO), GSPO, CISPO, plain REINFORCE.

Every loss has the signature
`(logprobs, old_logprobs, advantages, mask, *, eps_low, eps_high) -> (loss_tokens, stats)`:
logprobs (B, T) carry the gradient, old_logprobs (B, T) are those of the policy that sampled
(detached), advantages (B, T) are already broadcast to tokens, mask (B, T) is 1 on trained
tokens. loss_tokens (B, T) is 0 where mask is 0; an aggregation (`aggregation.py`) reduces it.
stats: clip fractions (low, high, total) and ratio mean/min/max over trained tokens.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class PolicyLossFn(Protocol):
    """A per-token policy loss, an entry of POLICY_LOSSES (signature in the module docstring)."""

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        eps_low: float = ...,
        eps_high: float = ...,
    ) -> tuple[Tensor, dict[str, float]]: ...


@torch.no_grad()
def _ratio_stats(ratio: Tensor, low: Tensor, high: Tensor, m: Tensor) -> dict[str, float]:
    """Clip fractions and ratio summary over trained tokens (m: bool (B, T))."""
    n = int(m.sum())
    if n == 0:
        return {"clip_frac_low": 0.0, "clip_frac_high": 0.0, "clip_frac": 0.0,
                "ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}  # fmt: skip
    frac_low = float((low & m).sum()) / n
    frac_high = float((high & m).sum()) / n
    r = ratio[m]  # (n,)
    return {
        "clip_frac_low": frac_low,
        "clip_frac_high": frac_high,
        "clip_frac": frac_low + frac_high,
        "ratio_mean": float(r.mean()),
        "ratio_min": float(r.min()),
        "ratio_max": float(r.max()),
    }


def clipped_token(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate per token, -min(r A, clip(r, 1-eps_low, 1+eps_high) A).

    PPO (arXiv:1707.06347) as used by GRPO (arXiv:2402.03300); separate eps_low / eps_high is
    DAPO's clip-higher (arXiv:2503.14476). Departures: none in the math; padding tokens get ratio
    exactly 1 and loss 0, so garbage logprobs there never reach the loss.
    """
    m = mask > 0  # (B, T)
    ratio = torch.exp(torch.where(m, logprobs - old_logprobs, 0.0))  # (B, T)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # (B, T)
    loss = torch.maximum(-ratio * advantages, -clipped * advantages)  # (B, T)
    low = (ratio < 1.0 - eps_low) & (advantages < 0)  # clipped: no gradient
    high = (ratio > 1.0 + eps_high) & (advantages > 0)
    return torch.where(m, loss, 0.0), _ratio_stats(ratio, low, high, m)


def gspo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO: one length-normalised sequence ratio s = exp(mean_t log r_t), clipped per sequence.

    Zheng et al., arXiv:2507.18071. Written in the paper's GSPO-token form: token t carries the
    value sg[s] * pi_t / sg[pi_t], so its value is s and its gradient s * grad log pi_t. With a
    per-sequence advantage and `sequence_mean` aggregation this is exactly GSPO's gradient; with
    per-token advantages (e.g. GAE) it is GSPO-token. Clipping acts on s, so a clipped sequence
    contributes no gradient at all. Departures: none; clip ranges default to the paper's 3e-4/4e-4.
    """
    m = mask > 0  # (B, T)
    log_ratio = torch.where(m, logprobs - old_logprobs, 0.0)  # (B, T)
    n = m.sum(dim=1).clamp(min=1)  # (B,)
    seq_log_ratio = log_ratio.sum(dim=1) / n  # (B,)
    token_log_ratio = seq_log_ratio.detach()[:, None] + logprobs - logprobs.detach()  # (B, T)
    ratio = torch.exp(torch.where(m, token_log_ratio, 0.0))  # (B, T): value s, grad s * dlogp
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # (B, T)
    loss = torch.maximum(-ratio * advantages, -clipped * advantages)  # (B, T)
    low = (ratio < 1.0 - eps_low) & (advantages < 0)
    high = (ratio > 1.0 + eps_high) & (advantages > 0)
    return torch.where(m, loss, 0.0), _ratio_stats(ratio, low, high, m)


def cispo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 1.0,
    eps_high: float = 5.0,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO: -sg[clip(r, 1-eps_low, 1+eps_high)] * A * log pi per token (MiniMax-M1, arXiv:2506.13585).

    The importance weight is clipped and detached, so every token keeps a gradient (PPO's clip
    zeroes the gradient of clipped tokens, which silences rare "fork" tokens). The paper sets no
    lower bound (eps_low >= 1 means the weight is only floored at 0) and tunes only eps_high
    without publishing it; our default eps_high = 5.0 follows peer implementations. Clip
    fractions count truncated weights (those tokens still get a gradient).
    """
    m = mask > 0  # (B, T)
    ratio = torch.exp(torch.where(m, logprobs - old_logprobs, 0.0))  # (B, T)
    weight = ratio.clamp(max(0.0, 1.0 - eps_low), 1.0 + eps_high).detach()  # (B, T)
    loss = -weight * advantages * logprobs  # (B, T)
    low = ratio < 1.0 - eps_low
    high = ratio > 1.0 + eps_high
    return torch.where(m, loss, 0.0), _ratio_stats(ratio, low, high, m)


def reinforce(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.0,
    eps_high: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE, -A * log pi per token, no ratio and no clip (Williams 1992; RLOO, arXiv:2402.14740).

    Correct for one update per batch of fresh samples (off-policy drift is only corrected by TIS
    in the objective). eps_low / eps_high are unused and kept for the uniform signature; ratio
    stats against old_logprobs are still reported as a staleness metric, clip fractions are 0.
    """
    m = mask > 0  # (B, T)
    loss = -advantages * logprobs  # (B, T)
    with torch.no_grad():
        ratio = torch.exp(torch.where(m, logprobs - old_logprobs, 0.0))  # (B, T)
    none = torch.zeros_like(m)
    return torch.where(m, loss, 0.0), _ratio_stats(ratio, none, none, m)


POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "clipped_token": clipped_token,
    "gspo": gspo,
    "cispo": cispo,
    "reinforce": reinforce,
}
