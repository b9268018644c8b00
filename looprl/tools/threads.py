"""Threads for sync tools: a call that hangs loses its thread, never the pool or the process.

`concurrent.futures.ThreadPoolExecutor` fits tools badly: its threads are joined at interpreter
exit (a tool that never returns keeps the process alive after the work is done), and a call
that overruns keeps its thread, so a few hung calls starve every later call of every tool.

`ToolThreads` runs each call on a daemon thread. A caller that gives up on a call (its timeout
fired, or its episode was cancelled) calls `abandon`: the thread stops counting against
`max_threads`, a fresh thread takes the next call, and the abandoned one exits when (if ever)
its call returns. At most `max_abandoned` calls may hang at once; past that, `submit` refuses
new work with `ToolThreadsExhausted`, since threads are not free (each holds a stack). Each call
carries a `label` (the executor gives the tool's name), so `hung` says which tools hang.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class ToolThreadsExhausted(RuntimeError):
    """Too many calls hang at once: no thread may be started for a new one."""


class ToolThreads:
    """A pool of daemon threads that replaces the threads of abandoned (hung) calls.

    `max_threads` bounds the calls running at once (not counting abandoned ones); further
    calls wait in FIFO order. `on_start`, when given to `submit`, is called on the worker
    thread just before the call runs (the executor starts its timeout then, so time spent
    waiting for a thread is never charged to the tool).
    """

    def __init__(self, max_threads: int, *, max_abandoned: int = 256, name: str = "looprl-tool"):
        if max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        self.max_threads = max_threads
        self.max_abandoned = max_abandoned
        self.name = name
        self._lock = threading.Lock()
        self._queue: deque[_Job] = deque()
        self._idle = 0  # live workers waiting for work
        self._live = 0  # workers not abandoned (busy or idle)
        self._running: dict[Future[Any], threading.Thread] = {}
        self._abandoned: dict[threading.Thread, str] = {}  # thread -> label of its hung call
        self._labels: dict[Future[Any], str] = {}
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._count = 0

    @property
    def abandoned(self) -> int:
        """Calls given up on whose thread is still running them."""
        with self._lock:
            return len(self._abandoned)

    def hung(self) -> dict[str, int]:
        """Abandoned calls still running, counted by label, most first."""
        with self._lock:
            counts = Counter(self._abandoned.values())
        return dict(counts.most_common())

    def submit(
        self, fn: Callable[[], Any], on_start: Callable[[], object] | None = None, label: str = ""
    ) -> Future[Any]:
        """Queue `fn()` for a thread; the future holds its result or exception."""
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("ToolThreads is closed")
            if len(self._abandoned) >= self.max_abandoned:
                raise ToolThreadsExhausted(
                    f"{len(self._abandoned)} tool calls are hung on their threads (limit "
                    f"{self.max_abandoned}); a tool never returns: fix it, make it async, or run "
                    "it in a sandbox process"
                )
            self._queue.append(_Job(fn, future, on_start))
            self._labels[future] = label
            # an idle worker counts as idle until it wakes: a burst of calls needs more workers
            # than the idle ones, not one notify per call to the same sleeping worker
            if len(self._queue) > self._idle and self._live < self.max_threads:
                self._start_worker()
            self._wake.notify()
        return future

    def abandon(self, future: Future[Any]) -> None:
        """Give up on a call: cancel it if it has not started, else free its slot in the pool."""
        if future.cancel():
            return
        with self._lock:
            thread = self._running.pop(future, None)
            label = self._labels.pop(future, "")
            if thread is None:
                return  # it finished meanwhile
            self._abandoned[thread] = label
            self._live -= 1
            if self._queue and not self._idle and self._live < self.max_threads:
                self._start_worker()

    def close(self) -> None:
        """Stop idle workers and cancel queued calls; running and hung calls end on their own."""
        with self._lock:
            self._closed = True
            while self._queue:
                future = self._queue.popleft().future
                future.cancel()
                self._labels.pop(future, None)
            self._wake.notify_all()

    def _start_worker(self) -> None:
        """Start one worker (the lock is held)."""
        self._live += 1
        self._count += 1
        thread = threading.Thread(target=self._work, name=f"{self.name}-{self._count}", daemon=True)
        thread.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._idle += 1
                    self._wake.wait()
                    self._idle -= 1
                if not self._queue:  # closed
                    self._live -= 1
                    return
                job = self._queue.popleft()
                if not job.future.set_running_or_notify_cancel():
                    self._labels.pop(job.future, None)
                    continue
                self._running[job.future] = me
            job.run()
            with self._lock:
                if me in self._abandoned:
                    del self._abandoned[me]
                    return  # a fresh worker took this one's place
                self._running.pop(job.future, None)
                self._labels.pop(job.future, None)


class _Job:
    """One queued call."""

    __slots__ = ("fn", "future", "on_start")

    def __init__(
        self, fn: Callable[[], Any], future: Future[Any], on_start: Callable[[], object] | None
    ) -> None:
        self.fn = fn
        self.future = future
        self.on_start = on_start

    def run(self) -> None:
        """Run the call, storing its result or exception (BaseException too) in the future."""
        try:
            if self.on_start is not None:
                self.on_start()
            result = self.fn()
        except BaseException as exc:  # the tool's failure belongs to its caller
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)
