"""Per-token staleness: how far each sampled token's policy lags the trained one, and its bound.

With in-flight weight updates one episode, even one reply, mixes tokens sampled by several policy
versions. A token's lag is `trained_version - version`: the optimizer steps between the weights
that sampled it and the weights the update trains (version -1, unknown, counts as lag 0).
`within_bound` keeps the tokens whose lag is at most `max_staleness`: the bound AReaL (Fu et al.,
"AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning", 2025)
puts on whole samples, applied here to each token, since with PipelineRL's in-flight updates
(Piché et al., "PipelineRL", 2025) one sequence carries several versions.

The objective needs nothing else: each token's behaviour logprob is the one its sampler recorded
(`sampler_logprobs`), so TIS weights pi_trainer / pi_sampler per token whatever its version.

Departures: AReaL refuses to *generate* past the bound; we generate and mask what arrives too
stale (counted as `async/tokens_too_stale`). The metrics group lags 0, 1, 2 and 3 or more.
All functions take (B, T) tensors and return tensors or plain floats; no state.
"""

from __future__ import annotations

import torch
from torch import Tensor

LAG_BUCKETS = ("0", "1", "2", "3plus")
"""Names of the lag groups of the metrics: lag 0, 1, 2, and 3 or more."""


def token_lags(versions: Tensor, trained_version: int) -> Tensor:
    """Lag of each token, `trained_version - version`, clamped at 0; unknown (-1) reads 0: (B, T)."""
    lags = (trained_version - versions).clamp(min=0)  # (B, T)
    return torch.where(versions < 0, 0, lags)  # (B, T)


def within_bound(lags: Tensor, mask: Tensor, max_staleness: int) -> Tensor:
    """The mask with tokens lagging more than `max_staleness` set to 0 (same dtype): (B, T)."""
    return mask * (lags <= max_staleness).to(mask.dtype)  # (B, T)


def lag_bucket(lags: Tensor) -> Tensor:
    """Index into `LAG_BUCKETS` of each token's lag: (B, T) long."""
    return lags.clamp(max=len(LAG_BUCKETS) - 1).long()  # (B, T)


def staleness_stats(lags: Tensor, mask: Tensor) -> dict[str, float]:
    """Mean and max lag and the fraction of tokens per lag group, over tokens where mask > 0.

    Keys: `staleness_mean`, `staleness_max`, `staleness_frac_lag<b>` for b in `LAG_BUCKETS`
    (they sum to 1); empty when no token is masked in.
    """
    on = lags[mask > 0].float()  # (N,)
    if not on.numel():
        return {}
    counts = torch.bincount(lag_bucket(on), minlength=len(LAG_BUCKETS))  # (4,)
    out = {"staleness_mean": float(on.mean()), "staleness_max": float(on.max())}
    for name, count in zip(LAG_BUCKETS, counts.tolist(), strict=True):
        out[f"staleness_frac_lag{name}"] = count / on.numel()
    return out


def logprob_gap_by_lag(
    trainer_logprobs: Tensor, sampler_logprobs: Tensor, lags: Tensor, mask: Tensor
) -> dict[str, tuple[float, float]]:
    """Mean |trainer - sampler logprob| of the tokens of each lag group, with their count.

    Returns `{bucket: (mean gap, tokens)}` for the groups that hold a token where mask > 0.
    Lag 0 is the engine/trainer numerical gap (`policy/logprob_gap`); lag k adds what k
    optimizer steps moved the policy on those tokens.
    """
    on = mask > 0  # (B, T)
    gap = (trainer_logprobs.detach() - sampler_logprobs).abs()[on]  # (N,)
    buckets = lag_bucket(lags[on])  # (N,)
    out: dict[str, tuple[float, float]] = {}
    for index, name in enumerate(LAG_BUCKETS):
        chosen = gap[buckets == index]  # (n_b,)
        if chosen.numel():
            out[name] = (float(chosen.mean()), float(chosen.numel()))
    return out
