"""The pool's handle on one fork-server worker process: start it, exchange frames, stop it.

The worker is a plain `subprocess.Popen` whose pipes are read and written through the running
event loop's reader/writer callbacks, so nothing here belongs to one event loop: an executor
created in one `asyncio.run` keeps working in the next. A reply is awaited together with the
worker's exit (a pidfd), so a dead worker surfaces as `ConnectionError` at once, and replies
owed to cancelled calls are counted and skipped, so a cancelled call never answers the next.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from looprl.sandbox import proto
from looprl.sandbox.policy import WorkerConfig

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# Import the worker without running looprl/__init__.py (which may import heavy libraries).
BOOTSTRAP = """
import sys, types
for name, sub in (("looprl", "/looprl"), ("looprl.sandbox", "/looprl/sandbox")):
    module = types.ModuleType(name)
    module.__path__ = [sys.argv[1] + sub]
    sys.modules[name] = module
from looprl.sandbox.worker import main
main()
"""


class WorkerProcess:
    """One worker process as the pool sees it (which call holds it is the pool's `FairQueue`)."""

    def __init__(self, index: int, uid: int, lean_uid: int) -> None:
        self.index = index
        self.uid = uid
        self.lean_uid = lean_uid
        self.proc: subprocess.Popen[bytes] | None = None
        self.pidfd: int | None = None
        self.generation = 0
        self.features: dict[str, Any] = {}
        self.broken = False
        self._frames = proto.FrameBuffer()
        self._ready: collections.deque[Any] = collections.deque()
        self._owed = 0
        self._stale_until = 0.0

    async def start(self, python: str, config: WorkerConfig, env: dict[str, str]) -> None:
        """Launch the worker, send its configuration (with this worker's uids) and wait for its
        hello."""
        self.proc = subprocess.Popen(
            [python, "-I", "-c", BOOTSTRAP, PACKAGE_ROOT],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd="/", close_fds=True,
        )  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        os.set_blocking(self.proc.stdin.fileno(), False)
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.pidfd = os.pidfd_open(self.proc.pid) if hasattr(os, "pidfd_open") else None
        self._frames, self._ready, self._owed, self._stale_until = (
            proto.FrameBuffer(),
            collections.deque(),
            0,
            0.0,
        )
        self.broken = False
        self.generation += 1
        config = dataclasses.replace(config, uid=self.uid, lean_uid=self.lean_uid)
        hello = await asyncio.wait_for(self.call(config.to_dict()), 120)
        if hello.get("op") != "hello":
            raise RuntimeError(f"sandbox worker sent {hello!r} instead of its hello")
        self.features = hello["features"]

    def _gone(self) -> ConnectionError:
        code = self.proc.poll() if self.proc is not None else None
        return ConnectionError(f"sandbox worker {self.index} exited (code {code})")

    async def _write(self, data: bytes) -> None:
        """Write a whole frame; a write cut short (cancelled) leaves the worker `broken`."""
        assert self.proc is not None and self.proc.stdin is not None
        fd, loop = self.proc.stdin.fileno(), asyncio.get_running_loop()
        view = memoryview(data)
        self.broken = True
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                ready: asyncio.Future[None] = loop.create_future()

                def writable(f: asyncio.Future[None] = ready) -> None:
                    """Wake the writer when the pipe has room."""
                    if not f.done():
                        f.set_result(None)

                loop.add_writer(fd, writable)
                try:
                    await ready
                finally:
                    loop.remove_writer(fd)
            except OSError as exc:
                raise self._gone() from exc
        self.broken = False

    async def _next_frame(self) -> Any:
        """The next reply frame from the worker (possibly one owed to a cancelled call)."""
        if self._ready:
            return self._ready.popleft()
        assert self.proc is not None and self.proc.stdout is not None
        out, loop = self.proc.stdout.fileno(), asyncio.get_running_loop()
        got: asyncio.Future[None] = loop.create_future()

        def fail(exc: BaseException) -> None:
            """End the wait with an error (the worker died or sent garbage)."""
            if not got.done():
                got.set_exception(exc)

        def readable() -> None:
            """Read what the worker sent; wake the waiter once a whole frame is in."""
            try:
                data = os.read(out, 1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                return fail(self._gone())
            try:
                self._ready.extend(self._frames.feed(data))
            except proto.ProtocolError as exc:
                return fail(exc)
            if self._ready and not got.done():
                got.set_result(None)

        loop.add_reader(out, readable)
        if self.pidfd is not None:
            loop.add_reader(self.pidfd, lambda: fail(self._gone()))
        try:
            await got
        finally:
            loop.remove_reader(out)
            if self.pidfd is not None:
                loop.remove_reader(self.pidfd)
        return self._ready.popleft()

    def patience(self, budget: float) -> float:
        """Seconds to wait for a reply: `budget`, plus what calls cut off earlier may still take."""
        return budget + max(0.0, self._stale_until - time.monotonic())

    async def call(self, msg: dict[str, Any], budget: float = 120.0) -> dict[str, Any]:
        """Send one request and return its reply; ConnectionError if the worker is gone.

        Replies are read in order. A call that was cancelled (a tool timeout, a closed event
        loop) leaves its reply owed; the next call discards it before reading its own.
        """
        if self.proc is None or self.proc.stdout is None or self.broken:
            raise ConnectionError(f"sandbox worker {self.index} is not usable")
        await self._write(proto.encode(msg))
        self._owed += 1
        self._stale_until = max(self._stale_until, time.monotonic() + budget)
        while True:
            frame = await self._next_frame()
            self._owed -= 1
            if self._owed == 0:
                self._stale_until = 0.0
                return dict(frame)

    def kill(self) -> None:
        """Kill the worker at once (its sandboxes die with it) and release its descriptors."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        self._release(proc)

    async def stop(self) -> None:
        """Ask the worker to shut down (it kills its sandboxes); kill it after 3 s."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ConnectionError, OSError):
                await asyncio.wait_for(self._write(proto.encode({"op": "shutdown"})), 1)
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # end of file: an orphaned inner worker exits too
        end = time.monotonic() + 3
        while proc.poll() is None and time.monotonic() < end:
            await asyncio.sleep(0.01)
        self.kill()

    def _release(self, proc: subprocess.Popen[bytes]) -> None:
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
