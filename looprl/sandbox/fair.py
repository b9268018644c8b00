"""Fair hand-out of a pool's slots (workers, process slots, connections) to waiting calls.

A first-come-first-served pool makes a quick call wait for every call queued before it: behind
one episode's backlog of ten-second loops, a `print(2+2)` of another episode waits for all of
them. Here every call names its *caller* (an episode: by default its session id, or the
`caller` the tool passes; a call with neither is a caller of its own), and a free slot goes to
the waiting call that comes first by

1. the fewest calls its caller has running (each caller's share of the slots), then
2. the caller served least recently (round robin between callers), then
3. arrival order (so one caller's own calls stay in the order it made them).

This is per-caller fair queueing (as in per-flow fair queueing of network packets, with calls
as the unit instead of bytes): a caller with a backlog takes its turn like any other, so a quick
call of another caller waits at most for the first slot to free up, not for the backlog.

What it cannot do: know that a call is long before it runs (calls are not preempted). Calls of
distinct callers that have nothing running and have not been served are taken in arrival order,
so a quick call behind long calls of many *different* fresh callers still waits for them; and a
caller with calls running yields to newcomers for as long as new callers keep arriving faster
than slots free up. A caller with nothing running or waiting is forgotten (its round-robin
place included), so the bookkeeping stays as small as the queue.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass
class _Waiter:
    """One call waiting for a slot: `slot` is the one it must have (a session's worker) or None."""

    caller: Hashable
    slot: int | None
    seq: int
    future: asyncio.Future[int]


class FairQueue:
    """`size` slots shared fairly between callers (see the module docstring).

    `await acquire(caller)` returns a free slot's index (`acquire(caller, slot=i)` waits for
    slot `i` itself); `release(slot, caller)` gives it back. Used from one event loop at a
    time: in a new loop every slot starts free again (a call cut off with its loop never
    releases its slot; the pool's owner deals with what such a call left behind).
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a pool needs at least one slot, got {size}")
        self.size = size
        self.busy = [False] * size
        self._last_used = [0] * size  # dispatch number of each slot's latest call
        self._running: Counter[Hashable] = Counter()
        self._queued: Counter[Hashable] = Counter()
        self._served: dict[Hashable, int] = {}  # caller -> dispatch number of its latest call
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()
        self._dispatches = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def waiting(self) -> int:
        """Calls waiting for a slot now."""
        return len(self._waiting)

    async def acquire(self, caller: Hashable, slot: int | None = None) -> int:
        """Wait for a slot (slot `slot` when given) and return its index."""
        if slot is not None and not 0 <= slot < self.size:
            raise ValueError(f"slot {slot} is out of range for a pool of {self.size}")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._reset(loop)
        waiter = _Waiter(caller, slot, next(self._seq), loop.create_future())
        self._waiting.append(waiter)
        self._queued[caller] += 1
        self._dispatch()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(waiter.future.result(), caller)  # handed a slot, then cancelled
            else:
                self._drop(waiter)
            raise

    def release(self, slot: int, caller: Hashable) -> None:
        """Give `slot` back (after `acquire` returned it for `caller`) and serve the next call."""
        self.busy[slot] = False
        self._running[caller] -= 1
        if self._running[caller] <= 0:
            del self._running[caller]
            self._forget_if_idle(caller)
        self._dispatch()

    def _reset(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start over in a new event loop: waiters of the old one can never be woken."""
        self._loop = loop
        self.busy = [False] * self.size
        self._running.clear()
        self._queued.clear()
        self._served.clear()
        self._waiting.clear()

    def _drop(self, waiter: _Waiter) -> None:
        if waiter in self._waiting:
            self._waiting.remove(waiter)
            self._queued[waiter.caller] -= 1
            if self._queued[waiter.caller] <= 0:
                del self._queued[waiter.caller]
            self._forget_if_idle(waiter.caller)

    def _forget_if_idle(self, caller: Hashable) -> None:
        if caller not in self._running and caller not in self._queued:
            self._served.pop(caller, None)

    def _rank(self, w: _Waiter) -> tuple[int, int, int]:
        return (self._running[w.caller], self._served.get(w.caller, 0), w.seq)

    def _dispatch(self) -> None:
        """Hand free slots to the waiting calls that come first (module docstring)."""
        while self._waiting and not all(self.busy):
            ready = [w for w in self._waiting if w.slot is None or not self.busy[w.slot]]
            if not ready:
                return
            best = min(ready, key=self._rank)
            slot = best.slot if best.slot is not None else self._pick_free()
            self._drop(best)
            if best.future.done():  # cancelled while waiting: its task drops it too
                continue
            number = next(self._dispatches)
            self.busy[slot] = True
            self._last_used[slot] = number
            self._running[best.caller] += 1
            self._served[best.caller] = number
            best.future.set_result(slot)

    def _pick_free(self) -> int:
        """For a call that may use any slot: the free one that the fewest waiting calls need
        for themselves, least recently used among those."""
        pinned = Counter(w.slot for w in self._waiting if w.slot is not None)
        free = [i for i in range(self.size) if not self.busy[i]]
        return min(free, key=lambda i: (pinned[i], self._last_used[i]))
