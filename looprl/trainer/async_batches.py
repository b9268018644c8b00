"""Bounded-staleness batches: generate the batches of later steps while the current one trains.

With `trainer.max_async_steps = k`, the trainer keeps the generation of up to k later batches
running while step n's update runs; each batch records the policy version (the optimizer step
whose weights sampled it) and is used at most k steps later. The rules that keep it exact:

- a batch's generation runs to its end on one version: before a weight sync the trainer waits
  for every started generation (`Ahead.idle`), so no episode mixes two versions;
- batches start in step order, each from the task cursor the previous one left;
- no batch is started ahead across a checkpoint step, so a run resumed from a checkpoint
  generates exactly what the uninterrupted run did (the price: the pipeline empties there);
- a batch older than k (it cannot happen by construction; a guard for engines that restart) is
  dropped and counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from looprl.types import EpisodeResult

Groups = list[list[EpisodeResult]]


@dataclass
class Batch:
    """One step's groups, the seconds their generation took, and the policy version that
    sampled them; `max_staleness` is k."""

    groups: Groups
    seconds: float
    version: int
    max_staleness: int
    dropped: int = 0

    def metrics(self, step: int) -> dict[str, float]:
        """Generation time, staleness (updates between the sampling policy and the trained one)
        and the episodes dropped as too stale."""
        return {
            "time/generate": self.seconds,
            "rollout/staleness": float(self.staleness(step)),
            "rollout/stale_dropped": float(self.dropped),
        }

    def staleness(self, step: int) -> int:
        """How many updates the policy trained at `step` is ahead of the one that sampled this."""
        return max(0, step - 1 - self.version)


Collect = Callable[[int, "asyncio.Task[Batch] | None"], Coroutine[Any, Any, Batch]]


class Ahead:
    """The batches started ahead of the update, by step, from `first_step` on (module doc)."""

    def __init__(self, collect: Collect, first_step: int) -> None:
        self.collect = collect
        self.tasks: dict[int, asyncio.Task[Batch]] = {}
        self.started = first_step - 1  # the last step whose generation has started

    @property
    def pending(self) -> bool:
        """Whether any batch beyond the one taken is being generated."""
        return bool(self.tasks)

    def start_through(self, last: int) -> None:
        """Start the generation of every step up to `last` not started yet, in order."""
        while self.started < last:
            self.started += 1
            previous = self.tasks.get(self.started - 1)
            self.tasks[self.started] = asyncio.create_task(self.collect(self.started, previous))

    async def take(self, step: int) -> Batch:
        """Step `step`'s batch; its groups are dropped (and counted) if it is staler than k."""
        self.start_through(step)
        batch = await self.tasks.pop(step)
        if batch.staleness(step) > batch.max_staleness:
            batch.dropped = sum(len(g) for g in batch.groups)
            batch.groups = []
        return batch

    async def idle(self) -> None:
        """Wait until every started generation has finished (the engine is idle)."""
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()))
