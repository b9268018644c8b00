"""Sync tools in a forked child per call (`isolation="process"`): a hung call is killed, so 50
of them leave no thread, process or descriptor behind and every later call is answered."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
from helpers import add
from helpers import tool_call as call

from looprl.tools import TIMEOUT, ToolError, ToolExecutor, ToolReply

RELEASE = threading.Event()  # set only by the thread-mode test, to end its hung threads


def sleep_forever(seconds: float) -> str:
    """Never return.

    Args:
        seconds: ignored.
    """
    RELEASE.wait()
    return "released"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def children() -> set[int]:
    """Pids whose parent is this process (zombies included), from /proc."""
    me, found = os.getpid(), set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == me:
            found.add(int(entry))
    return found


async def test_fifty_hung_calls_are_killed_and_later_calls_answer() -> None:
    ex = ToolExecutor([sleep_forever, add], timeout=0.1, isolation="process")
    await ex.run([call("add", 0, a=1, b=1)], {})  # warm: the first call's imports and fds
    threads, fds, kids = set(threading.enumerate()), open_fds(), children()
    for batch in range(5):  # 5 turns of 10 concurrent calls that never return
        hung = await ex.run([call("sleep_forever", i, seconds=1) for i in range(10)], {})
        assert {(r.error_kind, r.infra) for r in hung} == {(TIMEOUT, True)}
        (r,) = await ex.run([call("add", batch, a=batch, b=1)], {})
        assert (r.content, r.error_kind) == (str(batch + 1), None)
    assert ex.hung_calls == 0
    # no thread left behind (counting all would see an earlier test's thread end meanwhile)
    assert set(threading.enumerate()) <= threads and open_fds() == fds and children() == kids
    ex.close()


async def test_forked_calls_keep_what_threads_give() -> None:
    """Closures, ToolReply statuses, ToolError kinds and exceptions cross the fork."""
    base = 40

    def offset(x: int) -> int:
        """x plus a closure's value.

        Args:
            x: a number.
        """
        return base + x

    def status() -> ToolReply:
        """A reply with a status."""
        return ToolReply("fine", status="ok")

    def refuse() -> str:
        """Fail with a kind."""
        raise ToolError("backend down", kind="down", infra=True)

    def crash() -> str:
        """Raise."""
        raise ValueError("bad input")

    def leave() -> str:
        """Exit the process."""
        os._exit(3)

    kids = children()
    ex = ToolExecutor([offset, status, refuse, crash, leave], isolation="process")
    calls = [call("offset", 0, x=2), call("status", 1), call("refuse", 2), call("crash", 3)]
    calls.append(call("leave", 4))
    r = await ex.run(calls, {})
    assert r[0].content == "42"
    assert (r[1].content, r[1].status) == ("fine", "ok")
    assert (r[2].error_kind, r[2].infra, r[2].content) == ("down", True, "Error: backend down")
    assert (r[3].error_kind, r[3].content) == ("exception", "Error: ValueError: bad input")
    assert r[4].error_kind == "exception" and "ended without an answer" in r[4].content
    assert children() == kids


async def test_a_cancelled_episode_kills_its_child() -> None:
    kids = children()
    ex = ToolExecutor([sleep_forever], timeout=30, isolation="process")
    task = asyncio.ensure_future(ex.run([call("sleep_forever", 0, seconds=1)], {}))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert children() == kids


def test_an_unknown_isolation_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="isolation 'fork'; choose one of thread, process"):
        ToolExecutor([add], isolation="fork")  # type: ignore[arg-type]


def test_the_thread_mode_loses_threads_where_the_process_mode_does_not() -> None:
    """The same 10 hung calls under threads leave 10 threads running (the contrast)."""
    ex = ToolExecutor([sleep_forever], timeout=0.1)
    before = threading.active_count()
    try:
        asyncio.run(ex.run([call("sleep_forever", i, seconds=1) for i in range(10)], {}))
        assert threading.active_count() - before == 10 and ex.hung_calls == 10
    finally:
        RELEASE.set()
        deadline = time.monotonic() + 5
        while ex.hung_calls and time.monotonic() < deadline:
            time.sleep(0.02)
        RELEASE.clear()
        ex.close()
