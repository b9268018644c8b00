"""Value-head loss for PPO: squared error to the GAE returns, with PPO's value clipping."""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float = 0.2
) -> tuple[Tensor, dict[str, float]]:
    """0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, -clip, clip): (B, T).

    PPO value clipping as in OpenAI baselines' ppo2 and cleanrl (the PPO paper, arXiv:1707.06347,
    uses the unclipped error; clipping keeps the value head from jumping in one update). A value
    moving more than `clip` away from V_old in the direction that worsens its error gets no
    gradient. Departures: none. stats: value_clip_frac, value_mean, return_mean over trained tokens.
    """
    m = mask > 0  # (B, T)
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)  # (B, T)
    err = (values - returns) ** 2  # (B, T)
    err_clipped = (v_clipped - returns) ** 2  # (B, T)
    loss = 0.5 * torch.maximum(err, err_clipped)  # (B, T)
    with torch.no_grad():
        n = max(int(m.sum()), 1)
        stats = {
            "value_clip_frac": float(((err_clipped > err) & m).sum()) / n,
            "value_mean": float(torch.where(m, values, 0.0).sum()) / n,
            "return_mean": float(torch.where(m, returns, 0.0).sum()) / n,
        }
    return torch.where(m, loss, 0.0), stats
