"""Sync tools in a forked child per call: a call that overruns is killed, never abandoned.

The opt-in `isolation="process"` of `ToolExecutor` (`ToolEnv(tool_isolation="process")`). Each
call forks the process (POSIX `fork`: the tool's closures, module state and arguments come
along, nothing is pickled on the way in), runs the tool in the child and reads its result back,
pickled, through a pipe. The caller's timeout cancels the read; the child is then killed with
SIGKILL and reaped at once, so a tool that hangs holds no thread, no process and no descriptor
after its call, and a run with hanging tools keeps every later call answered.

What it costs, and when to keep the default threads:
- a call's side effects on Python objects (a hidden `state` it mutates, a module global, a cache)
  stay in the child: a tool that keeps state between calls needs the thread mode;
- the return value must pickle (else its `repr` comes back), and so should the exceptions
  (else `RuntimeError: Type: message` comes back);
- one fork per call: about a millisecond for a small process, more for a large one;
- the child holds only the calling thread: a tool that needs a lock another thread held at the
  fork, or a thread pool of the parent (OpenMP, a torch intra-op pool), may block, and is then
  answered `timeout` and killed like any hung call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
from collections.abc import Callable
from typing import Any

_READ_SIZE = 1 << 16


async def call_in_child(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """`fn(**kwargs)` in a forked child; its value, or its exception raised here.

    Cancel the await (a timeout) to kill the child; it is reaped before this returns.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, answer, leave without running the parent's exit handlers
        os.close(read_fd)
        _run_child(fn, kwargs, write_fd)
    os.close(write_fd)
    try:
        data = await _read_all(read_fd)
    finally:
        os.close(read_fd)
        _kill_and_reap(pid)
    return _outcome(data)


def _run_child(fn: Callable[..., Any], kwargs: dict[str, Any], fd: int) -> None:
    """Run the call and write its pickled outcome to `fd`; never returns (`os._exit`)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends the child, not a tool call
        try:
            outcome: tuple[str, Any] = ("value", fn(**kwargs))
        except BaseException as exc:  # the tool's failure belongs to its caller
            outcome = ("raised", exc)
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(_pickled(outcome))
    finally:
        os._exit(0)


def _pickled(outcome: tuple[str, Any]) -> bytes:
    """The outcome pickled; what does not pickle travels as text."""
    kind, payload = outcome
    try:
        data = pickle.dumps(outcome)
        pickle.loads(data)  # an exception whose __init__ cannot take its args fails here
        return data
    except Exception:
        if kind == "value":
            return pickle.dumps(("value", repr(payload)))
        return pickle.dumps(("text", f"{type(payload).__name__}: {payload}"))


async def _read_all(fd: int) -> bytes:
    """Everything written to the pipe `fd` until the child closes it (on the event loop)."""
    loop = asyncio.get_running_loop()
    chunks: list[bytes] = []
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, _READ_SIZE)
        except OSError as exc:
            chunk = b""
            if not done.done():
                done.set_exception(exc)
        if chunk:
            chunks.append(chunk)
        elif not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
    return b"".join(chunks)


def _kill_and_reap(pid: int) -> None:
    """SIGKILL the child if it still runs, and wait for it (no zombie is left)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _outcome(data: bytes) -> Any:
    """The value the child sent, or raise the exception it sent."""
    if not data:
        raise RuntimeError("the tool's process ended without an answer (it exited or crashed)")
    kind, payload = pickle.loads(data)
    if kind == "value":
        return payload
    if kind == "raised":
        raise payload
    raise RuntimeError(payload)
