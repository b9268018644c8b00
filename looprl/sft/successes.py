"""What a bootstrap round measures (pass@1, pass@k, the GRPO signal) and which successes it keeps.

A round samples `n` attempts at each task; the rubric's reward decides success (`solved`).
pass@k is the unbiased estimator of Chen et al. (2021) from each task's n samples with c
successes, averaged over tasks. The hand-over estimate is the fraction of GRPO groups of size G
expected to hold both a success and a failure (non-zero reward variance, so a non-zero
advantage): for a task that succeeds with probability p, 1 - p^G - (1-p)^G. It is averaged over
tasks, with p^G and (1-p)^G estimated without bias from the same n samples, C(c, G) / C(n, G) and
C(n-c, G) / C(n, G) (the chance that G of the n attempts drawn without replacement all succeed,
or all fail), when n >= G, and with p = c / n otherwise.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from looprl.eval.run import solved
from looprl.eval.summary import pass_at_k
from looprl.types import EpisodeResult


def uniform_group_chance(n: int, c: int, g: int) -> float:
    """Estimated chance that a group of `g` samples of a task is all successes or all failures,
    from `n` samples with `c` successes (unbiased when n >= g, plug-in p = c / n otherwise)."""
    if not 0 <= c <= n or n < 1 or g < 1:
        raise ValueError(f"need 0 <= c <= n, n >= 1 and g >= 1; got n={n}, c={c}, g={g}")
    if n >= g:
        return (math.comb(c, g) + math.comb(n - c, g)) / math.comb(n, g)
    p = c / n
    return p**g + (1 - p) ** g


def signal_fraction(counts: Iterable[tuple[int, int]], g: int) -> float:
    """Mean over tasks of 1 - p^g - (1-p)^g: the expected fraction of GRPO groups of size `g`
    with non-zero reward variance; `counts` holds each task's (samples, successes)."""
    values = [1.0 - uniform_group_chance(n, c, g) for n, c in counts]
    return statistics.fmean(values) if values else 0.0


def task_counts(episodes: Iterable[EpisodeResult], threshold: float) -> dict[str, tuple[int, int]]:
    """Each task's (attempts, successes), by task id, in the order tasks first appear."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for ep in episodes:
        row = counts[ep.task.id]
        row[0] += 1
        row[1] += int(solved(ep, threshold))
    return {task: (n, c) for task, (n, c) in counts.items()}


@dataclass(frozen=True)
class RoundStats:
    """What one round's attempts say about the model that made them.

    `pass_at_1` and `pass_at_k` (k = the fewest attempts of any task) average the unbiased
    estimator over tasks; `signal` is `signal_fraction` at the trainer's group size;
    `tasks_solved` counts tasks with at least one success.
    """

    attempts: int
    successes: int
    tasks: int
    tasks_solved: int
    k: int
    pass_at_1: float
    pass_at_k: float
    signal: float


def round_stats(counts: dict[str, tuple[int, int]], group_size: int) -> RoundStats:
    """`RoundStats` of a round from its tasks' (attempts, successes) (`task_counts`)."""
    if not counts:
        raise ValueError("a round with no attempts has no statistics; sample at least one task")
    k = min(n for n, _ in counts.values())
    return RoundStats(
        attempts=sum(n for n, _ in counts.values()),
        successes=sum(c for _, c in counts.values()),
        tasks=len(counts),
        tasks_solved=sum(1 for _, c in counts.values() if c),
        k=k,
        pass_at_1=statistics.fmean(pass_at_k(n, c, 1) for n, c in counts.values()),
        pass_at_k=statistics.fmean(pass_at_k(n, c, k) for n, c in counts.values()),
        signal=signal_fraction(counts.values(), group_size),
    )


def completion_key(task_id: str, messages: list[dict[str, Any]]) -> str:
    """What two identical attempts share: the task and every message (OpenAI format)."""
    return task_id + "\n" + json.dumps(messages, sort_keys=True)


def keep_successes(
    episodes: Iterable[EpisodeResult], threshold: float, max_per_task: int, seen: set[str]
) -> list[EpisodeResult]:
    """The successes to train on, in sample order: each distinct completion once (those in
    `seen`, kept by an earlier round, are skipped; new ones are added to it), at most
    `max_per_task` per task."""
    per_task: dict[str, int] = defaultdict(int)
    kept = []
    for ep in episodes:
        if not solved(ep, threshold) or per_task[ep.task.id] >= max_per_task:
            continue
        key = completion_key(ep.task.id, [m.to_template() for m in ep.messages])
        if key in seen:
            continue
        seen.add(key)
        per_task[ep.task.id] += 1
        kept.append(ep)
    return kept
