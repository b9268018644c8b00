"""Evaluation: run tasks x rollouts, stream results to disk, resume, and summarise (pass@k and more)."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from looprl import safe_json
from looprl.engines.base import Engine
from looprl.envs.base import Environment
from looprl.files import write_text_atomically, writing
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import RolloutConfig, run_groups
from looprl.types import EpisodeResult, Summary, Task


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c successes (Chen et al. 2021, arXiv:2107.03374)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def summarize(
    episodes: list[EpisodeResult],
    *,
    rollouts_per_task: int,
    generate_seconds: float | None = None,
    pass_threshold: float = 1.0,
) -> Summary:
    """Summary statistics of an evaluation (or a training batch).

    Reward statistics use only episodes without rollout or scoring errors; errors are counted
    and listed separately. pass@k counts an episode as solved when its reward >= `pass_threshold`.
    """
    scored = [ep for ep in episodes if ep.trainable]
    rewards = [ep.reward for ep in scored]
    by_fn: dict[str, list[float]] = defaultdict(list)
    for ep in scored:
        for name, value in ep.rewards.items():
            by_fn[name].append(value)
    tool_errors: Counter[str] = Counter()
    for ep in episodes:
        tool_errors.update(ep.tool_errors)
    tokens = sum(ep.num_generated_tokens for ep in episodes)
    out = Summary(
        episodes=len(episodes),
        scored_episodes=len(scored),
        reward_mean=statistics.fmean(rewards) if rewards else float("nan"),
        reward_std=statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        rewards={name: statistics.fmean(vals) for name, vals in by_fn.items()},
        pass_at_k=_pass_at_k_table(scored, rollouts_per_task, pass_threshold),
        turns_mean=_mean([ep.num_turns for ep in episodes]),
        tool_calls_mean=_mean([ep.num_tool_calls for ep in episodes]),
        tool_errors=dict(sorted(tool_errors.items())),
        truncated=sum(ep.truncated for ep in episodes),
        stop_reasons=dict(Counter(ep.stop_reason for ep in episodes)),
        rollout_errors=sum(ep.rollout_error for ep in episodes),
        infra_errors=sum(ep.infra_error for ep in episodes),
        scoring_errors=sum(ep.scoring_error for ep in episodes),
        error_messages=_top_errors(episodes),
        template_breaks=sum(int(ep.metrics.get("template_breaks", 0)) for ep in episodes),
        generated_tokens=tokens,
        generated_tokens_mean=tokens / len(episodes) if episodes else 0.0,
    )
    if len({ep.task.env for ep in episodes}) > 1:
        from looprl.envs.mixture import per_env_summary

        out["per_env"] = per_env_summary(episodes)
    prompt = [ep.metrics["prompt_tokens"] for ep in episodes if "prompt_tokens" in ep.metrics]
    if prompt:  # a server reported its `usage`
        out["prompt_tokens"] = int(sum(prompt))
    if generate_seconds:
        out["generate_seconds"] = generate_seconds
        out["tokens_per_second"] = tokens / generate_seconds
    return out


def _mean(values: list[float] | list[int]) -> float:
    return statistics.fmean(values) if values else 0.0


def _pass_at_k_table(scored: list[EpisodeResult], r: int, threshold: float) -> dict[str, float]:
    groups: dict[str, list[bool]] = defaultdict(list)
    for ep in scored:
        groups[ep.task.id].append(ep.reward >= threshold - 1e-9)
    table = {}
    for k in range(1, r + 1):
        vals = [pass_at_k(len(g), sum(g), k) for g in groups.values() if len(g) >= k]
        if vals:
            table[f"pass@{k}"] = statistics.fmean(vals)
    return table


def _top_errors(episodes: list[EpisodeResult], limit: int = 5) -> list[str]:
    counts: Counter[str] = Counter()
    for ep in episodes:
        for err in ep.errors:
            fn = f" in {err['function']}" if err.get("function") else ""
            counts[f"{err.get('kind')}{fn}: {err.get('message', '')[:200]}"] += 1
    return [f"{n}x {msg}" for msg, n in counts.most_common(limit)]


class ResultsWriter:
    """Appends episodes to `results.jsonl`, one group per write so a crash never splits a group."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write_group(self, episodes: list[EpisodeResult]) -> None:
        """Append the group's lines and flush them to disk."""
        data = "".join(ep.to_json() + "\n" for ep in episodes)
        with writing(self.path), self.path.open("a", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def load_results(path: Path, *, repair: bool = False) -> tuple[list[EpisodeResult], int]:
    """Read a results file; returns (episodes, number of malformed lines skipped).

    With `repair`, a half-written last line (an interrupted write) is cut off the file so that
    appending can continue; complete lines are never touched.
    """
    if not path.exists():
        return [], 0
    raw = path.read_bytes()
    episodes, bad, good_end, offset = [], 0, 0, 0
    for line in raw.splitlines(keepends=True):
        offset += len(line)
        try:
            episodes.append(EpisodeResult.from_json(line.decode("utf-8")))
            good_end = offset
        except (ValueError, KeyError, TypeError):
            bad += 1
    if repair and good_end < len(raw) and not raw[good_end:].endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(good_end)
    return episodes, bad


def unfinished_groups(done: list[EpisodeResult], rollouts_per_task: int) -> set[str]:
    """Task ids whose episodes in `done` must run again: an incomplete group, or one that holds
    an infrastructure error (a dead server, a hung tool: the episode says nothing of the model).
    """
    counts = Counter(ep.task.id for ep in done)
    return {ep.task.id for ep in done if ep.infra_error or counts[ep.task.id] < rollouts_per_task}


def set_aside(results_path: Path, kept: list[EpisodeResult], dropped: list[EpisodeResult]) -> None:
    """Rewrite the results file with `kept`, appending `dropped` to `retried.jsonl` beside it.

    The rewrite is atomic (temporary file, fsync, rename): a kill leaves the old file or the new
    one, and the dropped episodes (to be run again) stay readable for diagnosis.
    """
    if dropped:
        ResultsWriter(results_path.with_name("retried.jsonl")).write_group(dropped)
    write_text_atomically(results_path, "".join(ep.to_json() + "\n" for ep in kept))


def error_headline(summary: Summary, *, fail_fraction: float = 0.5) -> tuple[str, bool]:
    """A one-line verdict on errored episodes and whether the run failed.

    Returns ("", False) when nothing errored. A run fails when at least `fail_fraction` of its
    episodes have rollout or infrastructure errors: its reward and pass@k then describe a few
    survivors, not the model, and the headline says so.
    """
    total, errored = summary["episodes"], summary["rollout_errors"]
    infra = summary["infra_errors"]
    if not errored:
        return "", False
    failed = total > 0 and errored >= fail_fraction * total
    kind = (
        f"{infra} infrastructure"
        if infra == errored
        else f"{infra} infrastructure, {errored - infra} environment"
    )
    retry = "; `--resume` runs them again" if infra else ""
    if failed:
        return (
            f"FAILED: {errored} of {total} episodes errored ({kind}); the reward and pass@k "
            f"above come from the {summary['scored_episodes']} that did not{retry}",
            True,
        )
    return f"warning: {errored} of {total} episodes errored ({kind}){retry}", False


async def evaluate(
    env: Environment,
    engine: Engine,
    tasks: list[Task],
    *,
    rollouts_per_task: int,
    renderer: Renderer | None,
    config: RolloutConfig,
    results_path: Path | None = None,
    done: list[EpisodeResult] | None = None,
    max_concurrent_groups: int = 64,
    on_group: Callable[[list[EpisodeResult]], None] | None = None,
) -> tuple[list[EpisodeResult], float]:
    """Evaluate `tasks`, skipping finished groups in `done`; returns (all episodes, seconds).

    Groups in `done` that are incomplete or hold an infrastructure error run again whole (group
    rewards need the whole group); their old episodes move to `retried.jsonl`.
    """
    done = done or []
    rerun = unfinished_groups(done, rollouts_per_task)
    kept = [ep for ep in done if ep.task.id not in rerun]
    seen = {ep.task.id for ep in kept}
    todo = [t for t in tasks if t.id not in seen]
    writer = ResultsWriter(results_path) if results_path else None
    if results_path and len(kept) != len(done):
        set_aside(results_path, kept, [ep for ep in done if ep.task.id in rerun])

    def handle(group: list[EpisodeResult]) -> None:
        if writer:
            writer.write_group(group)
        if on_group:
            on_group(group)

    start = time.perf_counter()
    groups = await run_groups(
        env,
        engine,
        [(t, list(range(rollouts_per_task))) for t in todo],
        renderer=renderer,
        config=config,
        max_concurrent_groups=max_concurrent_groups,
        on_group=handle,
    )
    elapsed = time.perf_counter() - start
    return kept + [ep for g in groups for ep in g], elapsed


def write_metadata(path: Path, metadata: dict[str, Any]) -> None:
    """Write metadata JSON atomically (temp file, fsync, rename)."""
    write_text_atomically(path, safe_json.dumps(metadata, indent=2))
