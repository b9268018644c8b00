"""Where a run's training tasks come from: the seeded stream in order, or by curriculum and hint.

`task_sampler(cfg, env)` gives the run its sampler. Without `[curriculum]` and `[hints]` it is a
`SeededStream`: the environment's seeded stream read from the trainer's task cursor. With
 `[curriculum]` on, a level is one value of the training tasks' `info["difficulty"]`, found
by scanning the first 1000 tasks of the run's seeded stream and sorted easiest first. A step's
tasks all come from the current level: the level's own stream is the run's stream with the
other levels' tasks skipped, and its position in the run's stream is kept, so the same seed
draws the same tasks. After each batch of groups (a step, or a dynamic-sampling refill round)
every group counts towards its level's running pass rate, whether training keeps it or not, and
the band controller (`controller.py`) may move the level. With `[hints]` on, each drawn task is
hinted with the probability the controller gives its level's pass rate (without a curriculum
all tasks form one level), from a generator seeded by the run's seed and the task's draw count.

Both kinds answer the trainer alike (`TaskSampler`): `draw(cursor, n)` the tasks of a batch,
`observe(step, groups)` its scored groups, `metrics(step)` what the step logs (`curriculum/...`,
docs/metrics.md), `state()` what a checkpoint keeps, `load_state` to continue it exactly.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from looprl.envs.base import GENERATED_EPOCH, Environment
from looprl.envs.hints import is_hinted, with_hint
from looprl.trainer.config import ConfigError, TrainConfig
from looprl.trainer.curriculum.controller import (
    Band,
    hint_probability,
    next_level,
    running_rate,
)
from looprl.types import EpisodeResult, Task

MAX_SKIPPED = 100_000  # tasks of other levels skipped in a row before a level counts as gone

Level = int | float | None
"""A difficulty value; None is the one level of a run with hints and no curriculum."""


def difficulty(task: Task) -> int | float:
    """The task's `info["difficulty"]`; ConfigError naming the fix when it is not a number."""
    value = task.info.get("difficulty")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            f"training task {task.id!r} has info['difficulty'] = {value!r}, not a number; the "
            "curriculum orders tasks by it: give your tasks one, or set curriculum.enabled = false"
        )
    return value


def find_levels(env: Environment, seed: int) -> list[Level]:
    """The difficulties among the first 1000 training tasks, easiest first (two at least)."""
    tasks = itertools.islice(env.iter_train_tasks(seed), GENERATED_EPOCH)
    levels: list[Level] = list(sorted({difficulty(t) for t in tasks}))
    if len(levels) < 2:
        raise ConfigError(
            f"curriculum: every training task of {env.name!r} has difficulty {levels[0]}; it "
            "needs two or more (calculator: env.kwargs.digits = [1, 2, 3]; search_qa: 1 and 2 "
            "hops, its default)"
        )
    return levels


class TaskSampler(Protocol):
    """What the trainer asks of its task sampler."""

    def draw(self, cursor: int, n: int) -> list[Task]:
        """`n` training tasks for the batch that starts at the trainer's task `cursor`."""
        ...

    def observe(self, step: int, groups: list[list[EpisodeResult]]) -> None:
        """Learn from a batch of step `step`'s scored groups."""
        ...

    def metrics(self, step: int) -> dict[str, float]:
        """What step `step` logs of the sampler."""
        ...

    def state(self) -> dict[str, Any] | None:
        """What a checkpoint keeps (JSON; None: nothing beyond the trainer's task cursor)."""
        ...

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Continue from a checkpoint's `state()`."""
        ...


def task_sampler(cfg: TrainConfig, env: Environment) -> TaskSampler:
    """The run's sampler: a `Curriculum` when `[curriculum]` or `[hints]` is on, else the stream."""
    if not (cfg.curriculum.enabled or cfg.hints.enabled):
        return SeededStream(env, cfg.trainer.seed)
    on = cfg.curriculum.enabled
    levels: list[Level] = find_levels(env, cfg.trainer.seed) if on else [None]
    return Curriculum(env, levels, cfg, moves=on)


class SeededStream:
    """The environment's seeded training stream, read from the trainer's cursor (no state of
    its own: the cursor is in the checkpoint), the open stream reused while it lines up."""

    def __init__(self, env: Environment, seed: int) -> None:
        self.env, self.seed = env, seed
        self._open: tuple[int, Iterator[Task]] | None = None

    def draw(self, cursor: int, n: int) -> list[Task]:
        """`n` training tasks from position `cursor` of the seeded stream."""
        if self._open is None or self._open[0] != cursor:
            self._open = (cursor, self.env.iter_train_tasks(self.seed, start=cursor))
        stream = self._open[1]
        tasks = [next(stream) for _ in range(n)]
        self._open = (cursor + n, stream)
        return tasks

    def observe(self, step: int, groups: list[list[EpisodeResult]]) -> None:
        """Nothing to learn: the stream's order is fixed."""

    def metrics(self, step: int) -> dict[str, float]:
        """None."""
        return {}

    def state(self) -> dict[str, Any] | None:
        """None: the trainer's cursor says where the stream is."""
        return None

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Nothing to load."""


@dataclass
class LevelStats:
    """What the sampler knows of one level."""

    rate: float | None = None
    """Running pass rate (None until a group of the level is scored)."""
    groups: int = 0
    """Groups scored at this level so far."""
    position: int = 0
    """Where this level's next task is looked for in the run's task stream."""


@dataclass
class StepTally:
    """One step's groups, counted over its batches, and the metrics after the latest."""

    groups: int = 0
    hinted: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


class Curriculum:
    """Draws a run's training tasks by level and hint, and learns from their scored groups."""

    def __init__(
        self, env: Environment, levels: list[Level], cfg: TrainConfig, *, moves: bool
    ) -> None:
        c = cfg.curriculum
        if c.start_level >= len(levels):
            raise ConfigError(
                f"curriculum.start_level = {c.start_level} but the tasks have {len(levels)} "
                f"levels {levels}; choose 0..{len(levels) - 1}"
            )
        self.env, self.levels, self.seed, self.moves = env, levels, cfg.trainer.seed, moves
        self.band = Band(c.target_low, c.target_high, c.ema, c.min_groups)
        self.pass_threshold = c.pass_threshold
        self.hint_target = cfg.hints.target if cfg.hints.enabled else None
        self.level = c.start_level  # the index of the level tasks are drawn from
        self.since_move = 0  # groups seen at the current level since it was reached
        self.drawn = 0  # tasks drawn so far: seeds each task's hint draw
        self.stats = [LevelStats() for _ in levels]
        self._streams: dict[int, tuple[int, Iterator[Task]]] = {}  # open streams by level
        self._steps: dict[int, StepTally] = {}

    # ------------------------------------------------------------ drawing
    def draw(self, cursor: int, n: int) -> list[Task]:
        """`n` training tasks of the current level, each hinted or not (the trainer's `cursor`
        is not used: each level keeps its own position in the stream)."""
        return [self._maybe_hint(self._next_task()) for _ in range(n)]

    def _next_task(self) -> Task:
        """The current level's next task from the run's stream (others' tasks are skipped)."""
        stats, level = self.stats[self.level], self.levels[self.level]
        start, stream = self._streams.get(self.level, (-1, iter(())))
        if start != stats.position:
            stream = self.env.iter_train_tasks(self.seed, start=stats.position)
        for _ in range(MAX_SKIPPED):
            task = next(stream)
            stats.position += 1
            if level is None or difficulty(task) == level:
                self._streams[self.level] = (stats.position, stream)
                return task
        raise ConfigError(
            f"curriculum: no task of difficulty {level} in {MAX_SKIPPED} training tasks from "
            f"position {stats.position - MAX_SKIPPED}; the environment's task generator must "
            "keep giving every level it gave in its first 1000 tasks"
        )

    def _maybe_hint(self, task: Task) -> Task:
        """The task with its environment's hint, drawn with the level's hint probability."""
        if self.hint_target is None:
            return task
        rng = random.Random(f"{self.seed}|hint|{self.drawn}")
        self.drawn += 1
        if rng.random() >= hint_probability(self.stats[self.level].rate, self.hint_target):
            return task
        hint = self.env.for_task(task).hint(task, rng)
        return task if hint is None else with_hint(task, hint)

    # ------------------------------------------------------------ learning
    def observe(self, step: int, groups: list[list[EpisodeResult]]) -> None:
        """Count a batch of step `step`'s scored groups: pass rates, then perhaps a move."""
        tally = self._steps.setdefault(step, StepTally())
        batch: dict[int, list[int]] = {}  # level index -> [passed, episodes]
        last = self.level
        for group in groups:
            scored = [ep for ep in group if ep.trainable]
            if not scored:
                continue
            last = self._index(group[0].task)
            counts = batch.setdefault(last, [0, 0])
            counts[0] += sum(ep.reward >= self.pass_threshold for ep in scored)
            counts[1] += len(scored)
            self.stats[last].groups += 1
            self.since_move += last == self.level
            tally.groups += 1
            tally.hinted += is_hinted(group[0].task)
        for index, (passed, episodes) in batch.items():
            stats = self.stats[index]
            stats.rate = running_rate(stats.rate, passed / episodes, self.band.ema)
        if self.moves:
            rate = self.stats[self.level].rate
            moved = next_level(self.level, rate, self.since_move, self.band, len(self.levels))
            if moved != self.level:
                self.level, self.since_move = moved, 0
        tally.metrics = self._metrics(tally, last)

    def _index(self, task: Task) -> int:
        return 0 if self.levels == [None] else self.levels.index(difficulty(task))

    def _metrics(self, tally: StepTally, index: int) -> dict[str, float]:
        """The step's `curriculum/...` metrics (`index`: the level its last group was drawn at)."""
        out: dict[str, float] = {}
        rate = self.stats[index].rate
        if rate is not None:
            out["curriculum/pass_rate"] = rate
        if self.hint_target is not None and tally.groups:
            out["curriculum/hint_rate"] = tally.hinted / tally.groups
        if not self.moves:
            return out
        out["curriculum/level"] = float(self.levels[index] or 0)
        for level, stats in zip(self.levels, self.stats, strict=True):
            out[f"curriculum/groups/{level:g}"] = float(stats.groups)
            if stats.rate is not None:
                out[f"curriculum/pass_rate/{level:g}"] = stats.rate
        return out

    def metrics(self, step: int) -> dict[str, float]:
        """The metrics of step `step` (taken once: its tally is dropped)."""
        tally = self._steps.pop(step, None)
        return tally.metrics if tally is not None else {}

    # ------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """Everything the sampler would need to go on exactly (JSON: a checkpoint's state)."""
        return {
            "levels": self.levels, "level": self.level, "since_move": self.since_move,
            "drawn": self.drawn, "stats": [[s.rate, s.groups, s.position] for s in self.stats],
        }  # fmt: skip

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Continue from `state()` of a checkpoint (None: the checkpoint had none; start fresh)."""
        if state is None:
            return
        if state["levels"] != self.levels:
            raise ConfigError(
                f"the checkpoint's curriculum levels {state['levels']} are not the tasks' "
                f"{self.levels}; resume with the run's env.kwargs"
            )
        self.level, self.since_move, self.drawn = (
            state["level"],
            state["since_move"],
            state["drawn"],
        )
        self.stats = [LevelStats(rate, groups, pos) for rate, groups, pos in state["stats"]]
        self._streams.clear()
