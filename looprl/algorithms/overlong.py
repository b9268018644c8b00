"""DAPO's overlong handling, usable with any preset: soft length penalty and truncated-sample masking.

Both come from DAPO (Yu et al., arXiv:2503.14476, section 3.4). A completion cut off at the
length limit gets a reward that says nothing about its reasoning, so either ramp a penalty in
the last `buffer` tokens before the limit (shaping), or leave truncated completions out of the
loss (masking).
"""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """Soft overlong punishment added to rewards: (N,) lengths -> (N,) values in [-penalty, 0].

    0 up to max_len - buffer tokens, then falling linearly to -penalty at max_len, and -penalty
    beyond (DAPO eq. 13, where penalty = 1). `lengths` count the tokens the policy generated.
    Departure: `penalty` scales the ramp (DAPO fixes it at 1); buffer <= 0 disables shaping.
    """
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    if buffer > max_len:
        raise ValueError(
            f"overlong buffer ({buffer}) exceeds max_len ({max_len}); use a smaller buffer"
        )
    start = max_len - buffer  # ramp starts here
    over = (lengths.float() - start).clamp(min=0.0)  # (N,) tokens into the buffer
    return -penalty * (over / buffer).clamp(max=1.0)  # (N,)


def mask_truncated(mask: Tensor, truncated: Tensor) -> Tensor:
    """Overlong filtering: zero the loss mask of every truncated sequence. (B, T), (B,) bool -> (B, T).

    The sequences stay in the batch (and in group baselines) but contribute no gradient and no
    trained tokens to the normaliser.
    """
    return mask * (~truncated.bool()).to(mask.dtype)[:, None]  # (B, T)
