"""Advantage estimators: sequence-level over groups of G rollouts, and token-level GAE.

Sequence-level estimators map rewards shaped (num_groups, G) (G rollouts of one task per row)
to advantages of the same shape; `broadcast_to_tokens` spreads them over a sequence's trained
tokens. `gae` is the token-level estimator PPO uses with a value head.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor


class AdvantageFn(Protocol):
    """A sequence-level estimator, an entry of ADVANTAGES: rewards (N, G) -> advantages (N, G)."""

    def __call__(self, rewards: Tensor, *, eps: float = ...) -> Tensor: ...


def _check_groups(rewards: Tensor) -> None:
    """Raise ValueError unless rewards is (num_groups, G) with G >= 2."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(
            f"rewards must be shaped (num_groups, G) with G >= 2 rollouts per task, got "
            f"{tuple(rewards.shape)}; sample at least 2 rollouts per task for group baselines"
        )


def group_normalized(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """GRPO advantage (R - mean_g) / (std_g + eps) (DeepSeekMath, arXiv:2402.03300, eq. 3 outcome supervision).

    Departures: std is the unbiased sample std (as TRL and veRL compute it); a group whose rewards
    are all equal gets advantage 0 (not NaN) thanks to eps.
    """
    _check_groups(rewards)
    r = rewards.float()  # (N, G)
    mean = r.mean(dim=1, keepdim=True)  # (N, 1)
    std = r.std(dim=1, keepdim=True)  # (N, 1)
    return (r - mean) / (std + eps)  # (N, G)


def group_mean(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """Dr. GRPO advantage R - mean_g, no std division (arXiv:2503.20783, section 3.2).

    Dividing by the group std up-weights tasks that are almost always solved or failed; Dr. GRPO
    drops it. `eps` is unused and kept so every estimator has the same signature.
    """
    _check_groups(rewards)
    r = rewards.float()  # (N, G)
    return r - r.mean(dim=1, keepdim=True)  # (N, G)


def leave_one_out(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """RLOO advantage R_i - mean of the other G-1 rewards (Ahmadian et al., arXiv:2402.14740).

    Equals G/(G-1) * (R_i - mean_g). `eps` is unused and kept for a uniform signature.
    """
    _check_groups(rewards)
    r = rewards.float()  # (N, G)
    g = r.shape[1]
    others = (r.sum(dim=1, keepdim=True) - r) / (g - 1)  # (N, G)
    return r - others  # (N, G)


def batch_whitened(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline advantage: R - mean_g, then whitened over the whole batch (arXiv:2501.03262).

    Departures: the paper whitens per token over the batch (long sequences weigh more); we whiten
    over sequences, so each rollout counts once. After the group-mean subtraction the batch mean is
    already 0, so whitening is a division by the batch std (unbiased) plus eps.
    """
    centered = group_mean(rewards)  # (N, G)
    flat = centered.flatten()  # (N * G,)
    std = flat.std() if flat.numel() > 1 else flat.new_tensor(0.0)
    return (centered - flat.mean()) / (std + eps)  # (N, G)


ADVANTAGES: dict[str, AdvantageFn] = {
    "group_normalized": group_normalized,
    "group_mean": group_mean,
    "leave_one_out": leave_one_out,
    "batch_whitened": batch_whitened,
}


def zero_variance_groups(rewards: Tensor) -> Tensor:
    """True for each group whose G rewards are all equal (DAPO dynamic sampling drops them, arXiv:2503.14476).

    Such a group has zero advantage under every group baseline, so it carries no gradient and only
    dilutes the batch. Returns a bool tensor (num_groups,).
    """
    _check_groups(rewards)
    return rewards.amax(dim=1) == rewards.amin(dim=1)  # (N,)


def broadcast_to_tokens(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """Spread a per-sequence value (B,) over the sequence's trained tokens: (B, T), 0 where mask is 0."""
    return per_sequence.float()[:, None] * mask.float()  # (B, T)


def terminal_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence's reward (B,) on its last trained token: (B, T) token rewards for `gae`.

    A sequence with no trained token gets no reward (there is nothing to credit).
    """
    m = mask.float()  # (B, T)
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)  # (B, T)
    last = (positions * m).argmax(dim=1)  # (B,) index of the last trained token
    out = torch.zeros_like(m)  # (B, T)
    has_tokens = m.sum(dim=1) > 0  # (B,)
    out[torch.arange(m.shape[0], device=m.device), last] = rewards.float() * has_tokens
    return out


@torch.no_grad()
def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over trained tokens only (Schulman et al., arXiv:1506.02438).

    rewards, values, mask: (B, T). Returns (advantages, returns), both (B, T) and 0 where mask is 0.

    Departures for multi-turn episodes: the recursion steps from one trained token (mask 1) to the
    next, skipping environment tokens (tool output, user turns, template glue; mask 0). Those carry
    no credit, and the value at the next trained token is the bootstrap, so a tool call's credit is
    judged by the state after the tool answered. Rewards at mask-0 positions are ignored: put a
    turn's reward on its last trained token (`terminal_rewards` does this for the final reward).
    The value after the last trained token is 0 (episodes end; truncation is handled by masking).
    """
    m = mask.float()  # (B, T)
    r = rewards.float() * m  # (B, T)
    v = values.detach().float()  # (B, T)
    advantages = torch.zeros_like(m)  # (B, T)
    next_value = torch.zeros_like(m[:, 0])  # (B,) value of the next trained token
    next_adv = torch.zeros_like(m[:, 0])  # (B,) advantage of the next trained token
    for t in reversed(range(m.shape[1])):
        trained = m[:, t] > 0  # (B,)
        delta = r[:, t] + gamma * next_value - v[:, t]  # (B,)
        adv_t = delta + gamma * lam * next_adv  # (B,)
        advantages[:, t] = torch.where(trained, adv_t, 0.0)
        next_value = torch.where(trained, v[:, t], next_value)
        next_adv = torch.where(trained, adv_t, next_adv)
    returns = (advantages + v) * m  # (B, T)
    return advantages, returns
