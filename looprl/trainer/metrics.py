"""The training metric vocabulary, declared once: names, meanings, and how a step's numbers become them.

Every key a training run writes to `metrics.jsonl` matches one entry of `METRICS` (a `<...>` part
stands for a reward function, an environment or a k); `tests/test_metrics_vocabulary.py` checks
that a real run emits nothing else and that docs/metrics.md lists exactly these names.

Each key lives in a namespace saying where it comes from: `reward/` and `env/` (the batch's
rewards), `rollout/` (its episodes), `loss/` (the terms of the objective), `policy/` (how the
policy moved: KL, entropy, clipping, ratios, the sampler/trainer gap), `value/` (PPO's critic),
`train/` (the optimizer step and the batch it trained on), `async/` (each trained token's
policy version: its staleness and logprob gap per version lag), `stream/` (streaming groups),
`time/`, `eval/` (held-out evaluation), `monitor/` (the reward-hacking monitors' 0/1 flags,
nothing else) and `curriculum/` (the task sampler's levels, pass rates and hints). `step` and
`wall_time` are the logger's own.

`OLD_NAMES` maps the bare names of runs written before the namespaces to their keys; every
reader of an existing `metrics.jsonl` passes its rows through `upgrade_row`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from looprl.types import Summary

METRICS: dict[str, str] = {
    # the batch's episodes (looprl.eval.summary.summarize)
    "reward/mean": "mean reward of the step's scored episodes",
    "reward/std": "standard deviation of those rewards",
    "reward/<fn>": "mean of one reward function or zero-weight metric",
    "env/<env>/reward": "mean reward of one environment of a mixture",
    "env/<env>/<fn>": "mean of one reward function of one environment of a mixture",
    "rollout/turns": "assistant turns per episode",
    "rollout/tool_calls": "tool calls per episode (malformed ones included)",
    "rollout/truncated_frac": "fraction of episodes cut by a limit",
    "rollout/errors": "episodes whose rollout failed (environment or infrastructure)",
    "rollout/infra_errors": "of those, infrastructure faults (engine, server, hung tool, timeout)",
    "rollout/scoring_errors": "episodes where a reward function raised",
    "rollout/gen_tokens": "tokens generated in the step",
    "rollout/tokens_per_s": "generated tokens per second of generation time",
    # bounded-staleness async (trainer.max_async_steps)
    "rollout/staleness": "updates between the policy that sampled the batch and the one it trains",
    "rollout/stale_dropped": "episodes dropped as staler than max_async_steps",
    # per-token policy versions (looprl.algorithms.staleness, trainer.max_staleness)
    "async/staleness_mean": "mean updates between each sampled token's policy and the trained one",
    "async/staleness_max": "the largest of those lags",
    "async/staleness_frac_lag<k>": "fraction of sampled tokens whose lag is k (0, 1, 2; 3plus: 3 or more)",
    "async/tokens_too_stale": "sampled tokens masked out of the loss as staler than max_staleness",
    "async/episodes_too_stale": "episodes dropped because every sampled token was too stale",
    "async/logprob_gap_lag<k>": "mean absolute trainer - sampler logprob gap of trained tokens of lag k (0, 1, 2, 3plus)",
    "stream/groups_carried": "streaming: finished groups left in the queue for later steps",
    "stream/trainer_wait_s": "streaming: seconds the step waited for its groups",
    "stream/trainer_wait_frac": "streaming: that wait over the step's wall time",
    "stream/sync_hold_s": "streaming: of that wait, seconds the sync waited for the requests under way",
    "stream/sampler_idle_s": "streaming: seconds since the last step the engine had no request",
    "stream/refilled": "streaming, dynamic sampling: zero-variance groups replaced since the last step",
    "stream/staleness_<k>": "streaming: trained groups sampled k updates behind the trained policy",
    # the update (looprl.trainer.update, looprl.algorithms.objective)
    "loss/total": "total loss, averaged over micro-batches",
    "loss/pg": "the policy-gradient term of it",
    "loss/kl": "the KL term of the loss (when kl_coef > 0)",
    "loss/entropy": "the entropy bonus term of the loss (when its coefficient is set)",
    "loss/value": "the value-head term of the loss (ppo)",
    "policy/kl": "KL to the reference model on trained tokens (when kl_coef > 0)",
    "policy/entropy": "mean token entropy of the policy on trained tokens",
    "policy/clip_frac": "fraction of trained tokens whose ratio was clipped",
    "policy/clip_frac_low": "of those, clipped below (ratio < 1 - eps_low)",
    "policy/clip_frac_high": "of those, clipped above (ratio > 1 + eps_high)",
    "policy/ratio_mean": "mean importance ratio pi/pi_old on trained tokens",
    "policy/ratio_min": "its minimum",
    "policy/ratio_max": "its maximum",
    "policy/mismatch_kl": "KL between the sampler's and the trainer's logprobs on sampled tokens",
    "policy/logprob_gap": "mean |trainer logprob - sampler logprob| on trained tokens (the sync check)",
    "policy/tis_weight_mean": "mean truncated importance-sampling weight (when TIS is on)",
    "policy/tis_clip_frac": "fraction of tokens whose TIS weight was truncated",
    "value/mean": "mean value prediction (ppo)",
    "value/clip_frac": "fraction of value predictions clipped (ppo)",
    "value/return_mean": "mean GAE return (ppo)",
    "train/grad_norm": "global gradient norm before clipping",
    "train/lr": "learning rate after the step",
    "train/skipped": "1 when no sample had a non-zero advantage, so no update ran",
    "train/nonfinite_skipped": "optimizer steps skipped because the loss or gradient norm was "
    "not finite (NaN or inf)",
    "train/error_skipped": "1 when errors left no group with two scored episodes, so the batch "
    "was skipped (no update ran; nothing regenerates it)",
    "train/tokens": "sampled tokens trained on",
    "train/forward_tokens": "tokens through forward and backward",
    "train/forward_positions": "positions through forward (prompt and tool tokens included; "
    "a prefix shared by samples of a micro-batch counts once per prefix-tree row with "
    "trainer.shared_prefix)",
    "train/tokens_per_s": "forward tokens per second of update time",
    "train/adv_mean": "mean advantage of the samples",
    "train/adv_abs_mean": "mean absolute advantage",
    "train/groups_used": "groups the advantages were computed over",
    "train/zero_var_frac": "fraction of groups whose rewards were all equal",
    "train/groups_all_correct_frac": "fraction of groups whose rollouts all solved the task "
    "(reward >= 1; harder tasks would teach more)",
    "train/groups_all_wrong_frac": "fraction of groups whose rollouts all got the same reward "
    "below 1 (easier tasks, larger groups or a warm start would teach more)",
    "train/uniform_steps_skipped": "1 when the batch had no gradient and trainer.skip_uniform_steps "
    "took no optimizer step (AdamW's momentum would have moved the weights)",
    "train/keep_frac": "fraction of samples kept for the update",
    # time, seconds
    "time/generate": "rolling out the step's groups",
    "time/score": "scoring them",
    "time/train": "the update",
    "time/sync": "giving the engine the new weights",
    "time/eval": "the held-out evaluation",
    # written by the logger on every row
    "step": "the optimizer step (0: the evaluation before training)",
    "wall_time": "seconds of run time so far (continues across resumes)",
    # held-out evaluation (every trainer.eval_every steps)
    "eval/reward": "mean reward on the held-out tasks",
    "eval/<fn>": "mean of one reward function or metric on them",
    "eval/pass@<k>": "unbiased pass@k on them",
    "eval/<env>/reward": "mean reward of one environment of a mixture on them",
    "eval/turns": "assistant turns per held-out episode",
    "eval/gen_tokens": "generated tokens per held-out episode",
    # reward-hacking monitors (looprl.trainer.monitors.core; 1.0 at a step where one tripped)
    "monitor/reward_vs_heldout": "1 at an evaluation where training reward rose while monitors.heldout_metric fell",
    "monitor/length_blowup": "1 when tokens or turns per episode jumped above monitors.length_ratio x their baseline",
    "monitor/tool_call_spike": "1 when tool calls per episode jumped above monitors.tool_call_ratio x their baseline",
    "monitor/format_only_reward": "1 when more than monitors.format_only_max of the episodes were paid by format alone",
    "monitor/entropy_collapse": "1 when policy/entropy fell below monitors.entropy_ratio x its level over the first steps",
    "monitor/kl_spike": "1 when policy/kl, policy/mismatch_kl or policy/logprob_gap jumped above monitors.spike_ratio x baseline",
    "monitor/repeated_ngrams": "1 when replies repeat more than monitors.ngram_repeat_max of their n-grams",
    "monitor/reward_disagreement": "1 when a reward function and a check that agreed no longer do",
    # the episode series the monitors compute (looprl.trainer.monitors)
    "rollout/reply_tokens": "tokens the policy sampled per episode (length_blowup reads it)",
    "rollout/format_only_frac": "fraction of scored episodes rewarded by format-type functions alone",
    "rollout/repeat_ngram_frac": "mean seq-rep-n of the replies: share of their n-grams repeating an earlier one",
    "rollout/reward_agreement": "lowest correlation among reward/check pairs that once agreed (when any did)",
    # the curriculum and hints ([curriculum], [hints]: looprl.trainer.curriculum)
    "curriculum/level": "difficulty (info['difficulty']) of the level the step's tasks came from",
    "curriculum/pass_rate": "running pass rate of that level after the step (of all tasks without a curriculum)",
    "curriculum/pass_rate/<level>": "running pass rate of one level (once it has one)",
    "curriculum/groups/<level>": "groups scored at one level so far",
    "curriculum/hint_rate": "fraction of the step's groups whose task came with a hint",
}

OLD_NAMES: dict[str, str] = {
    "turns": "rollout/turns",
    "tool_calls": "rollout/tool_calls",
    "truncated_frac": "rollout/truncated_frac",
    "rollout_errors": "rollout/errors",
    "infra_errors": "rollout/infra_errors",
    "scoring_errors": "rollout/scoring_errors",
    "gen_tokens": "rollout/gen_tokens",
    "tokens_per_s": "rollout/tokens_per_s",
    "staleness": "rollout/staleness",
    "stale_dropped": "rollout/stale_dropped",
    "loss": "loss/total",
    "pg_loss": "loss/pg",
    "kl_loss": "loss/kl",
    "entropy_loss": "loss/entropy",
    "value_loss": "loss/value",
    "kl": "policy/kl",
    "entropy": "policy/entropy",
    "clip_frac": "policy/clip_frac",
    "clip_frac_low": "policy/clip_frac_low",
    "clip_frac_high": "policy/clip_frac_high",
    "ratio_mean": "policy/ratio_mean",
    "ratio_min": "policy/ratio_min",
    "ratio_max": "policy/ratio_max",
    "mismatch_kl": "policy/mismatch_kl",
    "logprob_gap": "policy/logprob_gap",
    "tis_weight_mean": "policy/tis_weight_mean",
    "tis_clip_frac": "policy/tis_clip_frac",
    "value_mean": "value/mean",
    "value_clip_frac": "value/clip_frac",
    "return_mean": "value/return_mean",
    "grad_norm": "train/grad_norm",
    "lr": "train/lr",
    "skipped": "train/skipped",
    "nonfinite_skipped": "train/nonfinite_skipped",
    "train_tokens": "train/tokens",
    "forward_tokens": "train/forward_tokens",
    "forward_positions": "train/forward_positions",
    "train_tokens_per_s": "train/tokens_per_s",
    "adv_mean": "train/adv_mean",
    "adv_abs_mean": "train/adv_abs_mean",
    "groups_used": "train/groups_used",
    "zero_var_frac": "train/zero_var_frac",
    "keep_frac": "train/keep_frac",
    "all_correct_frac": "train/groups_all_correct_frac",
    "all_wrong_frac": "train/groups_all_wrong_frac",
    "uniform_steps_skipped": "train/uniform_steps_skipped",
    "reply_tokens": "rollout/reply_tokens",
    "format_only_frac": "rollout/format_only_frac",
    "repeat_ngram_frac": "rollout/repeat_ngram_frac",
    "reward_agreement": "rollout/reward_agreement",
}
"""The bare name each metric had before the namespaces, and its key now.

Runs written before read back through it (`upgrade_row`); the update's statistics
(`looprl.trainer.update`, `looprl.trainer.batch`, `looprl.algorithms`) still carry these short
names, free of logging concerns, and take their keys from it when a step is logged
(`update_metrics`).
"""

_PATTERNS = [
    re.compile(
        "^"
        + re.sub(r"<[a-z]+>", "[^/]+", re.escape(name).replace(r"\<", "<").replace(r"\>", ">"))
        + "$"
    )
    for name in METRICS
]


def declared(key: str) -> bool:
    """Whether a metric key is in the vocabulary."""
    return any(p.match(key) for p in _PATTERNS)


def check_metric_name(key: str) -> str:
    """`key` if it is a metric key; a ValueError naming the key to write instead otherwise.

    For config fields that name a metric (`trainer.early_stop_metric`, `monitors.heldout_metric`):
    a bare name of before the namespaces is refused with its new key, so a stop condition cannot
    silently never fire.
    """
    if key in OLD_NAMES:
        raise ValueError(
            f"{key!r} is the old name of a metric; write {OLD_NAMES[key]!r} (docs/metrics.md)"
        )
    if not declared(key):
        raise ValueError(f"{key!r} is not a metric key; docs/metrics.md lists them")
    return key


def upgrade_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A `metrics.jsonl` row with any bare name of before the namespaces renamed (`OLD_NAMES`)."""
    return {OLD_NAMES.get(k, k): v for k, v in row.items()}


def update_metrics(stats: Mapping[str, float], seconds: float) -> dict[str, float]:
    """The metrics of an update: its statistics (short names) under their keys, time, throughput.

    A statistic already under a declared key (`async/...`) keeps it; any other that `OLD_NAMES`
    does not know is refused, so a new one cannot reach `metrics.jsonl` without a declared name.
    """
    unknown = sorted(k for k in stats if k not in OLD_NAMES and not declared(k))
    if unknown:
        raise ValueError(
            f"update statistics {unknown} have no metric key: add each to OLD_NAMES and METRICS "
            "in looprl/trainer/metrics.py (and docs/metrics.md)"
        )
    out = {OLD_NAMES.get(k, k): v for k, v in stats.items()}
    out["time/train"] = seconds
    # tokens that went through forward and backward (zero-advantage samples are skipped)
    out["train/tokens_per_s"] = stats.get("forward_tokens", 0.0) / max(seconds, 1e-9)
    return out


def batch_metrics(summary: Summary, num_episodes: int) -> dict[str, float]:
    """The metrics of a training batch's episodes."""
    out = {
        "reward/mean": summary["reward_mean"],
        "reward/std": summary["reward_std"],
        "rollout/turns": summary["turns_mean"],
        "rollout/tool_calls": summary["tool_calls_mean"],
        "rollout/truncated_frac": summary["truncated"] / max(1, num_episodes),
        "rollout/errors": float(summary["rollout_errors"]),
        "rollout/infra_errors": float(summary["infra_errors"]),
        "rollout/scoring_errors": float(summary["scoring_errors"]),
        "rollout/gen_tokens": float(summary["generated_tokens"]),
        "rollout/tokens_per_s": summary.get("tokens_per_second", 0.0),
    }
    out.update({f"reward/{k}": v for k, v in summary["rewards"].items()})
    for env_name, row in summary.get("per_env", {}).items():  # mixtures: one series per env
        if "reward" in row:
            out[f"env/{env_name}/reward"] = row["reward"]
        out.update({f"env/{env_name}/{k}": v for k, v in row.get("rewards", {}).items()})
    return out


def eval_metrics(summary: Summary) -> dict[str, float]:
    """The metrics of a held-out evaluation (prefixed `eval/`)."""
    out = {"eval/reward": summary["reward_mean"]}
    out.update({f"eval/{k}": v for k, v in summary["rewards"].items()})
    out.update({f"eval/{k}": v for k, v in summary["pass_at_k"].items()})
    for env_name, row in summary.get("per_env", {}).items():
        if "reward" in row:
            out[f"eval/{env_name}/reward"] = row["reward"]
    out["eval/turns"] = summary["turns_mean"]
    out["eval/gen_tokens"] = summary["generated_tokens_mean"]
    return out
