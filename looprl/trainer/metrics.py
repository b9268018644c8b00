"""The training metric vocabulary, declared once: names, meanings, and how a `Summary` becomes them.

Every key a training run writes to `metrics.jsonl` matches one entry of `METRICS` (a `<...>` part
stands for a reward function, an environment or a k); `tests/test_metrics_vocabulary.py` checks
that a real run emits nothing else and that docs/metrics.md lists exactly these names.
"""

from __future__ import annotations

import re

from looprl.eval.summary import Summary

METRICS: dict[str, str] = {
    # the batch's episodes (looprl.eval.summary.summarize)
    "reward/mean": "mean reward of the step's scored episodes",
    "reward/std": "standard deviation of those rewards",
    "reward/<fn>": "mean of one reward function or zero-weight metric",
    "env/<env>/reward": "mean reward of one environment of a mixture",
    "env/<env>/<fn>": "mean of one reward function of one environment of a mixture",
    "turns": "assistant turns per episode",
    "tool_calls": "tool calls per episode (malformed ones included)",
    "truncated_frac": "fraction of episodes cut by a limit",
    "rollout_errors": "episodes whose rollout failed (environment or infrastructure)",
    "infra_errors": "of those, infrastructure faults (engine, server, hung tool, timeout)",
    "scoring_errors": "episodes where a reward function raised",
    "tokens_per_s": "generated tokens per second of generation time",
    "gen_tokens": "tokens generated in the step",
    # the update (looprl.trainer.update, looprl.algorithms.objective)
    "loss": "total loss, averaged over micro-batches",
    "pg_loss": "the policy-gradient term of it",
    "kl": "KL to the reference model on trained tokens (when kl_coef > 0)",
    "kl_loss": "the KL term of the loss (when kl_coef > 0)",
    "entropy": "mean token entropy of the policy on trained tokens",
    "entropy_loss": "the entropy bonus term of the loss (when its coefficient is set)",
    "clip_frac": "fraction of trained tokens whose ratio was clipped",
    "clip_frac_low": "of those, clipped below (ratio < 1 - eps_low)",
    "clip_frac_high": "of those, clipped above (ratio > 1 + eps_high)",
    "ratio_mean": "mean importance ratio pi/pi_old on trained tokens",
    "ratio_min": "its minimum",
    "ratio_max": "its maximum",
    "mismatch_kl": "KL between the sampler's and the trainer's logprobs on sampled tokens",
    "logprob_gap": "mean |trainer logprob - sampler logprob| on trained tokens (the sync check)",
    "tis_weight_mean": "mean truncated importance-sampling weight (when TIS is on)",
    "tis_clip_frac": "fraction of tokens whose TIS weight was truncated",
    "value_loss": "value-head loss (ppo)",
    "value_mean": "mean value prediction (ppo)",
    "value_clip_frac": "fraction of value predictions clipped (ppo)",
    "return_mean": "mean GAE return (ppo)",
    "grad_norm": "global gradient norm before clipping",
    "lr": "learning rate after the step",
    "skipped": "1 when no sample had a non-zero advantage, so no update ran",
    "train_tokens": "sampled tokens trained on",
    "forward_tokens": "tokens through forward and backward",
    "forward_positions": "positions through forward (prompt and tool tokens included)",
    "adv_mean": "mean advantage of the samples",
    "adv_abs_mean": "mean absolute advantage",
    "groups_used": "groups the advantages were computed over",
    "zero_var_frac": "fraction of groups whose rewards were all equal",
    "keep_frac": "fraction of samples kept for the update",
    "train_tokens_per_s": "forward tokens per second of update time",
    # bounded-staleness async (trainer.max_async_steps)
    "staleness": "updates between the policy that sampled the batch and the one it trains",
    "stale_dropped": "episodes dropped as staler than max_async_steps",
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
    "monitor/entropy_collapse": "1 when entropy fell below monitors.entropy_ratio x its level over the first steps",
    "monitor/kl_spike": "1 when kl, mismatch_kl or logprob_gap jumped above monitors.spike_ratio x baseline",
    "monitor/repeated_ngrams": "1 when replies repeat more than monitors.ngram_repeat_max of their n-grams",
    "monitor/reward_disagreement": "1 when a reward function and a check that agreed no longer do",
    "reply_tokens": "tokens the policy sampled per episode (length_blowup reads it)",
    "format_only_frac": "fraction of scored episodes rewarded by format-type functions alone",
    "repeat_ngram_frac": "mean seq-rep-n of the replies: share of their n-grams repeating an earlier one",
    "reward_agreement": "lowest correlation among reward/check pairs that once agreed (when any did)",
}

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


def batch_metrics(summary: Summary, num_episodes: int) -> dict[str, float]:
    """The metrics of a training batch's episodes."""
    out = {
        "reward/mean": summary["reward_mean"],
        "reward/std": summary["reward_std"],
        "turns": summary["turns_mean"],
        "tool_calls": summary["tool_calls_mean"],
        "truncated_frac": summary["truncated"] / max(1, num_episodes),
        "rollout_errors": float(summary["rollout_errors"]),
        "infra_errors": float(summary["infra_errors"]),
        "scoring_errors": float(summary["scoring_errors"]),
        "tokens_per_s": summary.get("tokens_per_second", 0.0),
        "gen_tokens": float(summary["generated_tokens"]),
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
