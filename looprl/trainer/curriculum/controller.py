"""The band controller: a level's running pass rate, when to move a level, how often to hint.

Pure functions of numbers, no tasks and no state beyond their arguments. The rules:

1. a level's pass rate is a running average over batches, `p <- (1 - w) p + w r` with `r` the
   newest batch's pass rate at that level (`w` = `curriculum.ema`; the first batch sets `p = r`);
2. the current level moves once it has been seen in `min_groups` groups since the last move:
   up when `p > target_high` (groups that always pass carry no GRPO signal), down when
   `p < target_low` (groups that always fail carry none either), never past either end;
3. a training task is hinted with probability `clamp((target - p) / target, 0, 1)`: always
   while the level has no pass rate yet or none of its episodes pass, never once `p >= target`.

Departures from the curricula in the literature: a single frontier level rather than a learned
sampling distribution over all levels (the automatic curricula of Graves et al. 2017 or
Portelas et al. 2020); no review of easier levels; the band is set by hand.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Band:
    """The pass rates a level is kept within, and how fast the controller reacts."""

    low: float
    """Move down below this running pass rate."""
    high: float
    """Move up above it."""
    ema: float
    """Weight of the newest batch in the running pass rate."""
    min_groups: int
    """Groups seen at a level since the last move before it may move again."""


def running_rate(previous: float | None, batch_rate: float, weight: float) -> float:
    """The running pass rate after one more batch (rule 1): the batch's own when none yet."""
    if previous is None:
        return batch_rate
    return (1.0 - weight) * previous + weight * batch_rate


def next_level(level: int, rate: float | None, seen: int, band: Band, levels: int) -> int:
    """The level (an index among `levels`) after observing `rate` at `level` (rule 2)."""
    if rate is None or seen < band.min_groups:
        return level
    if rate > band.high and level < levels - 1:
        return level + 1
    if rate < band.low and level > 0:
        return level - 1
    return level


def hint_probability(rate: float | None, target: float) -> float:
    """How often a task at a level of running pass rate `rate` is hinted (rule 3)."""
    if rate is None:
        return 1.0
    return min(1.0, max(0.0, (target - rate) / target))
