"""The two calls a trainer makes: `group_advantages` once per batch, `policy_objective` per micro-batch.

A training step, in outline:

    cfg = resolve_algorithm("grpo")
    groups = group_advantages(cfg, rewards, lengths=lengths, truncated=truncated, max_len=max_tokens)
    # drop rollouts where groups.keep is False; spread groups.advantages over tokens with
    # broadcast_to_tokens, or for "gae" run gae(terminal_rewards(groups.rewards, mask), values, mask)
    norm = batch_normalizer(cfg.aggregation, [mb.mask for mb in micro_batches], max_len=cfg.max_len)
    for mb in micro_batches:
        loss, stats = policy_objective(cfg, logprobs=..., ..., normalizer=norm)
        loss.backward()
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from looprl.algorithms.advantages import ADVANTAGES, zero_variance_groups
from looprl.algorithms.aggregation import AGGREGATIONS
from looprl.algorithms.kl import KL_ESTIMATORS, mismatch_kl, truncated_importance_weights
from looprl.algorithms.losses import POLICY_LOSSES
from looprl.algorithms.overlong import overlong_penalty
from looprl.algorithms.presets import AlgorithmConfig
from looprl.algorithms.value import clipped_value_loss

#: Keys of `policy_objective`'s stats that are this micro-batch's contribution to the batch loss
#: (already divided by the batch normaliser, so they add up over micro-batches); every other key
#: but `num_tokens` is a mean over the micro-batch's `num_tokens` trained tokens.
LOSS_TERMS = frozenset({"loss", "pg_loss", "kl_loss", "entropy_loss", "value_loss"})


@dataclass
class GroupAdvantages:
    """Per-rollout results of `group_advantages`, all shaped (num_groups, G).

    `rewards`: rewards after overlong shaping (what `gae` consumes for a value-head algorithm).
    `advantages`: sequence-level advantages; None when cfg.advantage is token-level ("gae").
    `keep`: False for rollouts to leave out of the loss (dynamic sampling, overlong masking).
    `stats`: reward and filtering metrics.
    """

    rewards: Tensor
    advantages: Tensor | None
    keep: Tensor
    stats: dict[str, float]


def group_advantages(
    cfg: AlgorithmConfig,
    rewards: Tensor,
    *,
    lengths: Tensor | None = None,
    truncated: Tensor | None = None,
    max_len: int | None = None,
) -> GroupAdvantages:
    """Shape rewards (overlong penalty), compute sequence advantages, and mark rollouts to keep.

    rewards, lengths (generated tokens per rollout), truncated (bool): (num_groups, G).
    Dynamic sampling judges zero variance on the raw rewards, as DAPO filters on accuracy.
    """
    raw = rewards.float()  # (N, G)
    shaped = raw
    if cfg.overlong_buffer_frac > 0:
        if lengths is None or max_len is None:
            raise ValueError(
                "overlong shaping (overlong_buffer_frac > 0) needs lengths= and max_len="
            )
        buffer = cfg.overlong_buffer(max_len)
        shaped = raw + overlong_penalty(lengths, max_len, buffer, cfg.overlong_penalty)  # (N, G)
    keep = torch.ones_like(raw, dtype=torch.bool)  # (N, G)
    zero_var = zero_variance_groups(raw)  # (N,)
    if cfg.dynamic_sampling:
        keep &= ~zero_var[:, None]
    if cfg.overlong_masking:
        if truncated is None:
            raise ValueError("overlong_masking needs truncated= (bool per rollout)")
        keep &= ~truncated.bool()
    advantages = None
    if not cfg.uses_value_head:
        advantages = ADVANTAGES[cfg.advantage](shaped, eps=cfg.normalize_std_eps)  # (N, G)
    stats = {
        "reward_mean": float(raw.mean()),
        "shaped_reward_mean": float(shaped.mean()),
        "zero_variance_group_frac": float(zero_var.float().mean()),
        "keep_frac": float(keep.float().mean()),
    }
    return GroupAdvantages(rewards=shaped, advantages=advantages, keep=keep, stats=stats)


def _check_shapes(mask: Tensor, **tensors: Tensor | None) -> None:
    """Raise ValueError naming any tensor whose shape differs from the mask's (B, T)."""
    for name, t in tensors.items():
        if t is not None and t.shape != mask.shape:
            hint = (
                " (spread per-sequence values with broadcast_to_tokens)"
                if name == "advantages"
                else ""
            )
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}, expected mask's {tuple(mask.shape)}{hint}"
            )


def policy_objective(
    cfg: AlgorithmConfig,
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    sampler_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    values: Tensor | None = None,
    old_values: Tensor | None = None,
    returns: Tensor | None = None,
    normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss of one micro-batch: TIS-weighted policy loss + KL - entropy bonus + value loss.

    All tensors (B, T). old_logprobs: the trainer's logprobs under the weights that sampled (pass
    logprobs.detach() for one update per batch); sampler_logprobs: the engine's. normalizer: the
    whole batch's denominator (`batch_normalizer`) when accumulating micro-batches. Every loss term
    uses cfg.aggregation with that normalizer, so summed micro-batch losses equal the batch loss.
    stats: loss terms (`LOSS_TERMS`: loss, pg_loss, kl_loss, entropy_loss, value_loss) are this
    micro-batch's contributions; metrics (kl, entropy, clip/ratio, tis, mismatch_kl, logprob_gap) are means
    over its `num_tokens` trained tokens.
    """
    _check_shapes(mask, logprobs=logprobs, old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs,
                  advantages=advantages, ref_logprobs=ref_logprobs, entropy=entropy, values=values,
                  old_values=old_values, returns=returns)  # fmt: skip
    aggregate = AGGREGATIONS[cfg.aggregation]
    m = mask > 0  # (B, T)
    n = max(int(m.sum()), 1)
    old = old_logprobs.detach()  # (B, T)
    pg_tokens, stats = POLICY_LOSSES[cfg.policy_loss](
        logprobs, old, advantages.detach(), mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high
    )  # (B, T)
    if cfg.use_tis:
        weights = truncated_importance_weights(old, sampler_logprobs, cfg.tis_cap)  # (B, T)
        pg_tokens = pg_tokens * weights
        stats["tis_weight_mean"] = float(torch.where(m, weights, 0.0).sum()) / n
        stats["tis_clip_frac"] = float(((old - sampler_logprobs).exp() > cfg.tis_cap)[m].sum()) / n
    pg_loss = aggregate(pg_tokens, mask, normalizer=normalizer)  # ()
    loss = pg_loss
    stats["pg_loss"] = float(pg_loss.detach())
    if cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError(
                "kl_coef > 0 needs ref_logprobs (reference model logprobs); or set kl_coef=0"
            )
        kl_tokens = KL_ESTIMATORS[cfg.kl_estimator](logprobs, ref_logprobs.detach(), mask)  # (B, T)
        kl_loss = cfg.kl_coef * aggregate(kl_tokens, mask, normalizer=normalizer)
        loss = loss + kl_loss
        stats["kl_loss"] = float(kl_loss.detach())
    if ref_logprobs is not None:
        kl_metric = KL_ESTIMATORS[cfg.kl_estimator](logprobs.detach(), ref_logprobs, mask)  # (B, T)
        stats["kl"] = float(kl_metric.sum()) / n
    if entropy is not None:
        stats["entropy"] = float(torch.where(m, entropy.detach(), 0.0).sum()) / n
        if cfg.entropy_coef > 0:
            entropy_loss = -cfg.entropy_coef * aggregate(entropy, mask, normalizer=normalizer)
            loss = loss + entropy_loss
            stats["entropy_loss"] = float(entropy_loss.detach())
    if cfg.uses_value_head and values is None:
        raise ValueError(
            f"preset {cfg.name!r} trains a value head: pass values=, old_values=, returns="
        )
    if values is not None:
        if returns is None:
            raise ValueError("values= needs returns= (from gae) to train the value head")
        prev = old_values if old_values is not None else values.detach()
        v_tokens, v_stats = clipped_value_loss(
            values, prev.detach(), returns.detach(), mask, cfg.value_clip
        )
        value_loss = cfg.value_coef * aggregate(v_tokens, mask, normalizer=normalizer)
        loss = loss + value_loss
        stats.update(v_stats, value_loss=float(value_loss.detach()))
    stats["mismatch_kl"] = float(mismatch_kl(old, sampler_logprobs, mask))
    stats["logprob_gap"] = float(torch.where(m, (old - sampler_logprobs).abs(), 0.0).sum()) / n
    stats["num_tokens"] = float(m.sum())
    stats["loss"] = float(loss.detach())
    return loss, stats
