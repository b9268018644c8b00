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
from dataclasses import dataclass, field
from typing import Any

from looprl.trainer.config import TrainerSection
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
    extra: dict[str, float] = field(default_factory=dict)
    """Metrics of the way the batch was made (streaming's `stream/` keys)."""

    def metrics(self, step: int) -> dict[str, float]:
        """Generation time, staleness (updates between the sampling policy and the trained one)
        and the episodes dropped as too stale."""
        return {
            "time/generate": self.seconds,
            "rollout/staleness": float(self.staleness(step)),
            "rollout/stale_dropped": float(self.dropped),
            **self.extra,
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


Update = Callable[[Groups], dict[str, float]]


class AheadSource:
    """The batches of the barrier loop (k = 0) and of bounded staleness (k > 0), as the training
    loop takes them: `take`, `train` (while later batches generate), `synced`, `close`."""

    def __init__(self, ahead: Ahead, cfg: TrainerSection, *, release: Callable[[], None]) -> None:
        self.ahead, self.k = ahead, cfg.max_async_steps
        self.save_every, self.steps = cfg.save_every, cfg.steps
        self.release = release  # the engine's idle memory, freed when nothing generates

    def next_checkpoint(self, step: int) -> int:
        """The first step >= `step` that writes a checkpoint. Batches are never generated ahead
        across it, so a run resumed there regenerates exactly what the uninterrupted run did."""
        return min(-(-step // self.save_every) * self.save_every, self.steps)

    async def take(self, step: int) -> Batch:
        """Step `step`'s batch, once the batches up to k steps later (not past a checkpoint) run."""
        self.ahead.start_through(min(step + self.k, self.next_checkpoint(step)))
        return await self.ahead.take(step)

    async def train(self, update: Update, groups: Groups) -> dict[str, float]:
        """The update; later batches keep generating meanwhile, and the engine is idle after."""
        if not self.ahead.pending:
            self.release()  # no generation until the next batch
            return update(groups)
        metrics = await asyncio.to_thread(update, groups)
        await self.ahead.idle()  # the engine must be idle before its weights change
        return metrics

    def synced(self) -> None:
        """Nothing waits on the sync: the next `take` starts what comes next."""

    def state(self) -> dict[str, object]:
        """Nothing beyond the task cursor: no batch runs across a checkpoint."""
        return {}

    async def close(self) -> None:
        """Let the engine finish before shutting it down."""
        await self.ahead.idle()
