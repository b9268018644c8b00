"""Pure RL math for looprl: advantages, policy losses, aggregations, KL and corrections, presets.

Only torch and `looprl.types` are imported here. Pick an algorithm with `resolve_algorithm(name)`
and call `group_advantages` once per batch and `policy_objective` once per micro-batch.
"""

from looprl.algorithms.advantages import (
    ADVANTAGES,
    AdvantageFn,
    batch_whitened,
    broadcast_to_tokens,
    gae,
    group_mean,
    group_normalized,
    leave_one_out,
    terminal_rewards,
    zero_variance_groups,
)
from looprl.algorithms.aggregation import (
    AGGREGATIONS,
    AggregationFn,
    batch_normalizer,
    constant_normalizer,
    sequence_mean,
    token_mean,
)
from looprl.algorithms.kl import (
    KL_ESTIMATORS,
    KLFn,
    kl_k1,
    kl_k3,
    mismatch_kl,
    truncated_importance_weights,
)
from looprl.algorithms.logprobs import (
    entropy_from_logits,
    head_logprobs_entropy,
    logprobs_from_logits,
)
from looprl.algorithms.losses import (
    POLICY_LOSSES,
    PolicyLossFn,
    cispo,
    clipped_token,
    gspo,
    reinforce,
)
from looprl.algorithms.objective import (
    LOSS_TERMS,
    GroupAdvantages,
    group_advantages,
    policy_objective,
)
from looprl.algorithms.overlong import mask_truncated, overlong_penalty
from looprl.algorithms.presets import PRESETS, AlgorithmConfig, resolve_algorithm
from looprl.algorithms.value import clipped_value_loss

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "LOSS_TERMS",
    "POLICY_LOSSES",
    "PRESETS",
    "AdvantageFn",
    "AggregationFn",
    "AlgorithmConfig",
    "GroupAdvantages",
    "KLFn",
    "PolicyLossFn",
    "batch_normalizer",
    "batch_whitened",
    "broadcast_to_tokens",
    "cispo",
    "clipped_token",
    "clipped_value_loss",
    "constant_normalizer",
    "entropy_from_logits",
    "gae",
    "group_advantages",
    "group_mean",
    "group_normalized",
    "gspo",
    "head_logprobs_entropy",
    "kl_k1",
    "kl_k3",
    "leave_one_out",
    "logprobs_from_logits",
    "mask_truncated",
    "mismatch_kl",
    "overlong_penalty",
    "policy_objective",
    "reinforce",
    "resolve_algorithm",
    "sequence_mean",
    "terminal_rewards",
    "token_mean",
    "truncated_importance_weights",
    "zero_variance_groups",
]
