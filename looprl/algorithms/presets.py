"""Algorithm presets: one typed config naming an advantage, a loss and an aggregation, and the named presets.

Each preset names its paper and OUR departures from it. Shared by all presets:
  (a) KL to a reference is off (kl_coef = 0), as DAPO, Dr. GRPO and most recent recipes do; turn
      it on with kl_coef > 0 (k3 estimator by default).
  (b) Truncated importance sampling (TIS, cap 2) against the sampler's logprobs is on: it is a
      no-op when sampler and trainer agree and corrects the bias when they do not.
  (c) Advantages are sequence-level (one per rollout) and broadcast to the rollout's trained
      tokens; environment tokens (tool output, user turns) are never trained on.

grpo: DeepSeekMath, arXiv:2402.03300.
  1. No KL penalty by default (the paper uses beta = 0.04 with k3).
  2. Group std is the unbiased sample std, plus eps = 1e-6.
dr_grpo: "Understanding R1-Zero-Like Training", arXiv:2503.20783.
  1. L in sum / (G * L) is `max_len`; when unset, the longest padded length in the batch.
dapo: arXiv:2503.14476.
  1. Dynamic sampling drops zero-variance groups and trains on a smaller batch; the paper keeps
     sampling until the batch is full (the trainer may do that; this flag only marks the groups).
  2. The overlong buffer is a fraction of the max length (0.2, i.e. DAPO's 4096 of 20480 tokens).
gspo: arXiv:2507.18071.
  1. Implemented in GSPO-token form (identical gradient for per-sequence advantages).
cispo: MiniMax-M1, arXiv:2506.13585.
  1. The paper does not publish eps_high; we use 5.0 (weight cap 6) as peer implementations do.
     No lower bound (eps_low = 1.0: weights are only floored at 0), as in the paper.
rloo: "Back to Basics", arXiv:2402.14740.
  1. The paper treats the whole completion as one action (sum of token logprobs); we average
     over tokens of the batch (token_mean), as the other presets do.
reinforce_pp: REINFORCE++, arXiv:2501.03262 (its "baseline" variant for grouped sampling).
  1. Whitening is over sequences, not tokens. 2. No KL in the reward (the paper folds k1 KL in).
ppo: arXiv:1707.06347 with GAE, arXiv:1506.02438.
  1. gamma = lam = 1 (sparse terminal reward, as LLM PPO recipes use) and GAE skips environment
     tokens: the bootstrap comes from the next trained token.
  2. The value loss uses the same aggregation as the policy loss.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from looprl.algorithms.advantages import ADVANTAGES
from looprl.algorithms.aggregation import AGGREGATIONS
from looprl.algorithms.kl import KL_ESTIMATORS
from looprl.algorithms.losses import POLICY_LOSSES

TOKEN_ADVANTAGES = ("gae",)  # token-level estimators: need a value head, computed by `gae`


def _check_name(kind: str, name: str, choices: Any) -> None:
    """Raise ValueError naming the valid choices when `name` is not one of them."""
    if name not in choices:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {sorted(choices)}")


@dataclass(frozen=True)
class AlgorithmConfig:
    """Everything the RL math needs, validated on construction so a typo fails at start-up."""

    #: Preset this config came from (for logs); "custom" when built by hand.
    name: str = "custom"
    #: Advantage estimator: a key of ADVANTAGES, or "gae" (token-level, needs a value head).
    advantage: str = "group_normalized"
    #: Policy loss: a key of POLICY_LOSSES.
    policy_loss: str = "clipped_token"
    #: Loss aggregation: a key of AGGREGATIONS.
    aggregation: str = "sequence_mean"
    #: Lower clip: ratio floor 1 - eps_low (PPO 0.2).
    eps_low: float = 0.2
    #: Upper clip: ratio ceiling 1 + eps_high (PPO 0.2; DAPO clip-higher 0.28).
    eps_high: float = 0.2
    #: Added to the std when normalising advantages (avoids 0/0 on uniform groups).
    normalize_std_eps: float = 1e-6
    #: Weight of the KL penalty to the reference policy; 0 disables it (field default since DAPO).
    kl_coef: float = 0.0
    #: KL estimator: a key of KL_ESTIMATORS ("k3" as GRPO).
    kl_estimator: str = "k3"
    #: Multiply the policy loss by truncated importance weights pi_trainer / pi_sampler.
    use_tis: bool = True
    #: Cap of the TIS weights (2.0, the value the TIS write-up and veRL use).
    tis_cap: float = 2.0
    #: Weight of the entropy bonus; 0 disables it (entropy is still reported when given).
    entropy_coef: float = 0.0
    #: Weight of the value loss when a value head is trained (cleanrl's vf_coef 0.5).
    value_coef: float = 0.5
    #: Value clipping range around the old values (cleanrl / ppo2 use the policy clip, 0.2).
    value_clip: float = 0.2
    #: GAE discount (1.0: sparse terminal reward, no discounting of long reasoning).
    gamma: float = 1.0
    #: GAE lambda (1.0: Monte-Carlo returns minus the value baseline).
    lam: float = 1.0
    #: Drop groups whose rewards are all equal (DAPO dynamic sampling).
    dynamic_sampling: bool = False
    #: Leave truncated completions out of the loss (DAPO overlong filtering).
    overlong_masking: bool = False
    #: Soft overlong penalty ramp, as a fraction of the max length; 0 disables (DAPO: 0.2).
    overlong_buffer_frac: float = 0.0
    #: Reward at (and past) the max length under overlong shaping is -overlong_penalty (DAPO: 1).
    overlong_penalty: float = 1.0
    #: Dr. GRPO's constant length L for constant_normalizer; None = longest padded length.
    max_len: int | None = None
    #: Optimizer passes over each batch (PPO's epochs; 1: one pass, the ratio stays 1 on-policy).
    updates_per_batch: int = 1

    def __post_init__(self) -> None:
        _check_name("advantage", self.advantage, [*ADVANTAGES, *TOKEN_ADVANTAGES])
        _check_name("policy loss", self.policy_loss, POLICY_LOSSES)
        _check_name("aggregation", self.aggregation, AGGREGATIONS)
        _check_name("KL estimator", self.kl_estimator, KL_ESTIMATORS)
        nonneg = ("eps_low", "eps_high", "normalize_std_eps", "kl_coef", "value_coef", "value_clip")
        for field_name in nonneg:
            if getattr(self, field_name) < 0:
                raise ValueError(
                    f"algorithm.{field_name} must be >= 0, got {getattr(self, field_name)}"
                )
        if self.tis_cap <= 0:
            raise ValueError(f"algorithm.tis_cap must be > 0 (2.0 is usual), got {self.tis_cap}")
        for field_name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, field_name) <= 1.0:
                raise ValueError(
                    f"algorithm.{field_name} must be in [0, 1], got {getattr(self, field_name)}"
                )
        if not 0.0 <= self.overlong_buffer_frac < 1.0:
            raise ValueError(
                f"algorithm.overlong_buffer_frac must be in [0, 1) (a fraction of the max length), "
                f"got {self.overlong_buffer_frac}"
            )
        if self.updates_per_batch < 1:
            raise ValueError(
                f"algorithm.updates_per_batch must be >= 1 (1: one pass over each batch), got "
                f"{self.updates_per_batch}"
            )
        if self.max_len is not None and self.max_len <= 0:
            raise ValueError(
                f"algorithm.max_len must be a positive token count or None, got {self.max_len}"
            )

    @property
    def uses_value_head(self) -> bool:
        """Whether this algorithm needs a value head (token-level advantages from GAE)."""
        return self.advantage in TOKEN_ADVANTAGES

    def overlong_buffer(self, max_len: int) -> int:
        """The overlong shaping buffer in tokens for a generation limit of `max_len` tokens."""
        return int(round(self.overlong_buffer_frac * max_len))


PRESETS: dict[str, AlgorithmConfig] = {
    "grpo": AlgorithmConfig(name="grpo"),
    "dr_grpo": AlgorithmConfig(
        name="dr_grpo", advantage="group_mean", aggregation="constant_normalizer"
    ),
    "dapo": AlgorithmConfig(
        name="dapo",
        aggregation="token_mean",
        eps_high=0.28,
        dynamic_sampling=True,
        overlong_buffer_frac=0.2,
    ),
    "gspo": AlgorithmConfig(name="gspo", policy_loss="gspo", eps_low=3e-4, eps_high=4e-4),
    "cispo": AlgorithmConfig(
        name="cispo", policy_loss="cispo", aggregation="token_mean", eps_low=1.0, eps_high=5.0
    ),
    "rloo": AlgorithmConfig(
        name="rloo", advantage="leave_one_out", policy_loss="reinforce", aggregation="token_mean"
    ),
    "reinforce_pp": AlgorithmConfig(
        name="reinforce_pp", advantage="batch_whitened", aggregation="token_mean"
    ),
    "ppo": AlgorithmConfig(name="ppo", advantage="gae", aggregation="token_mean"),
}


def resolve_algorithm(name: str, **overrides: Any) -> AlgorithmConfig:
    """The preset `name` with `overrides` applied, validated; raises ValueError on any unknown name.

    Example: `resolve_algorithm("grpo", kl_coef=0.04, eps_high=0.28)`.
    """
    _check_name("preset", name, PRESETS)
    fields = {f.name for f in dataclasses.fields(AlgorithmConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown algorithm field(s) {unknown}; choose among {sorted(fields)}")
    return dataclasses.replace(PRESETS[name], **overrides)
