"""Streaming groups under torchrun: each rank streams its own tasks, every rank trains one batch.

With `--nproc N` and `trainer.streaming = true` generation stays free of collectives:

1. rank r runs the task positions p with p % N == r on its own engine into its own queue of
   finished groups (`looprl.trainer.streaming.GroupStream`, a 1/N share of the admission and
   refill budgets);
2. at a step's `take` the ranks exchange what each has ready, on `Dist.rollout_group` in a
   worker thread (the event loop keeps generating), and exchange again after `POLL_S` until
   `rollout.tasks_per_step` groups are ready over all ranks. A group is stamped with the
   exchange round that first reported it (rounds are collective, so every rank counts them
   alike);
3. every rank picks the same groups by one rule, `pick`: the smallest (round, task position);
   the picked groups' episodes are all-gathered, so every rank trains the same batch in the same
   order, as the barrier loop's `run_shared` gives;
4. groups not picked stay queued on their owner;
5. a checkpoint keeps every rank's stream state (cursor, groups trained, restarts, queue) in
   rank 0's `state.json`, one entry per rank; a resume needs the same N
   (`looprl.trainer.checkpoint.sharded.check_resume_world`). The ledger is rank 0's.

Streaming on vLLM servers (rank 0 alone drives them) is refused under torchrun
(`looprl.trainer.distributed.unsupported`).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from looprl.trainer import distributed as D
from looprl.trainer.streaming import StreamGroup, StreamSource, open_stream

POLL_S = 0.05
"""Seconds a rank waits for a group of its own before the ranks exchange again (too few ready)."""

Ready = tuple[int, int]
"""A ready group as the ranks exchange it: (the exchange round that first reported it, position)."""


@dataclass(frozen=True)
class Report:
    """One rank's part of an exchange: its ready groups, the episodes it dropped as stale and the
    groups it filtered since the last step, and whether its rollouts failed."""

    ready: list[Ready]
    dropped: int
    filtered: int
    failed: bool


def pick(ready: list[list[Ready]], n: int) -> list[Ready] | None:
    """The `n` groups a step trains out of every rank's ready ones: the smallest (round,
    position), in that order; None while fewer than `n` are ready."""
    every = sorted(r for part in ready for r in part)
    return every[:n] if len(every) >= n else None


class SharedStreamSource(StreamSource):
    """`StreamSource` whose step takes groups from every rank's stream (module doc)."""

    def __init__(self, base: StreamSource, d: D.Dist, total: int) -> None:
        super().__init__(
            base.stream, base.gate, max_staleness=base.max_staleness, in_flight=base.in_flight,
            ledger=base.ledger,
        )  # fmt: skip
        self.d, self.total = d, total
        self.round = 0  # exchanges so far (the same count on every rank)
        self.seen: dict[int, int] = {}  # position -> the round that first reported it

    async def groups(self, step: int) -> tuple[list[StreamGroup], int, int, int]:
        """Step `step`'s `total` groups over all ranks; the episodes dropped as stale, the groups
        carried over and those filtered, summed over ranks."""
        stream, dropped = self.stream, 0
        stream.fill()
        while True:
            dropped += stream.drop_stale(step, self.max_staleness)
            reports = await asyncio.to_thread(D.gather_objects, self.d, self._report(dropped),
                                              self.d.rollout_group)  # fmt: skip
            self.round += 1
            self._raise_failure(reports)
            chosen = pick([r.ready for r in reports], self.total)
            if chosen is not None:
                break
            stream.arrived.clear()
            with contextlib.suppress(TimeoutError):  # a group of its own, or the next exchange
                await asyncio.wait_for(stream.arrived.wait(), POLL_S)
        positions = [p for _, p in chosen]
        mine = stream.remove(set(positions))
        parts = await asyncio.to_thread(D.gather_objects, self.d, mine, self.d.rollout_group)
        found = {g.position: g for part in parts for g in part}
        for p in positions:
            self.seen.pop(p, None)
        carried = sum(len(r.ready) for r in reports) - self.total
        return (
            [found[p] for p in positions],
            sum(r.dropped for r in reports),
            carried,
            sum(r.filtered for r in reports),
        )

    def _report(self, dropped: int) -> Report:
        for g in self.stream.queue:
            self.seen.setdefault(g.position, self.round)
        ready = [(self.seen[g.position], g.position) for g in self.stream.queue]
        failed = self.stream.failure is not None
        return Report(ready, dropped, self.stream.filtered, failed)

    def _raise_failure(self, reports: list[Report]) -> None:
        if self.stream.failure is not None:
            raise self.stream.failure
        failed = [rank for rank, r in enumerate(reports) if r.failed]
        if failed:
            raise RuntimeError(
                f"rank {failed[0]}'s rollouts failed; its own error above says what to fix"
            )

    def state(self) -> dict[str, Any]:
        """Every rank's stream state (cursor, groups trained, `GroupStream.state`), by rank."""
        mine = {"cursor": self.stream.cursor, "trained": self.stream.trained, **self.stream.state()}
        return {"stream": {"ranks": D.gather_objects(self.d, mine, self.d.rollout_group)}}


def open_shared_stream(d: D.Dist, *, saved: dict[str, Any] | None, **kwargs: Any) -> StreamSource:
    """This rank's streaming source under torchrun; `kwargs` as `open_stream` takes them."""
    ranks = (saved or {}).get("ranks")  # N entries: check_resume_world saw the same N
    mine: dict[str, Any] = ranks[d.rank] if ranks else {}
    kwargs["cursor"] = int(mine.get("cursor", d.rank))
    base = open_stream(saved=mine, world=d.world, **kwargs)
    return SharedStreamSource(base, d, kwargs["cfg"].rollout.tasks_per_step)
