"""Fork-server pool life cycle: dead workers, session eviction, and a second event loop."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from looprl.sandbox import ForkServerExecutor, SandboxLimits, proto
from looprl.sandbox.supervise import Child, supervise

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the fork-server sandbox is Linux-only"
)

LIMITS = SandboxLimits(timeout=5, memory_mb=256, max_output_bytes=64 * 1024)


def small_pool(**kwargs) -> ForkServerExecutor:
    """One worker, nothing preloaded: starts in a fraction of a second."""
    return ForkServerExecutor(LIMITS, workers=1, preload=(), warmup=False, **kwargs)


async def test_a_dead_worker_is_a_sandbox_error_then_replaced():
    ex = small_pool()
    try:
        assert (await ex.execute("x = 1", session_id="s")).ok
        call = asyncio.create_task(ex.execute("import time\ntime.sleep(5)"))
        await asyncio.sleep(0.3)
        worker = ex._workers[0].proc
        assert worker is not None
        worker.kill()  # the infrastructure fails under the call
        r = await call
        assert r.status == "sandbox_error" and not r.model_fault and "retry" in r.message, r
        assert (await ex.execute("print('back')")).stdout == "back\n"
        r = await ex.execute("1", session_id="s")
        assert r.ok and r.session_reset and "earlier variables are gone" in r.message, r
    finally:
        await ex.close()


async def test_least_recently_used_session_is_closed_beyond_the_maximum():
    ex = small_pool(max_sessions=2)
    try:
        for sid in ("a", "b", "c"):
            assert (await ex.execute(f"name = {sid!r}", session_id=sid)).ok
        assert (await ex.execute("name", session_id="c")).value == "'c'"
        r = await ex.execute("name", session_id="a")
        assert (
            r.status == "error" and r.session_reset and "more than 2 open sessions" in r.message
        ), r
    finally:
        await ex.close()


def test_the_pool_keeps_working_in_a_second_event_loop():
    ex = small_pool()
    assert asyncio.run(ex.execute("x = 20", session_id="s")).ok
    r = asyncio.run(ex.execute("x + 1", session_id="s"))  # another asyncio.run: same workers
    assert r.value == "21" and not r.session_reset, r
    asyncio.run(ex.close())


def test_a_call_cut_off_with_its_event_loop_does_not_poison_the_next_loop():
    ex = small_pool()

    async def abandon() -> None:
        task = asyncio.create_task(ex.execute("import time\ntime.sleep(3)\nprint('late')"))
        await asyncio.sleep(0.5)
        task.cancel()  # the loop ends while the worker is still busy with this call

    asyncio.run(abandon())
    r = asyncio.run(ex.execute("print('fresh')"))
    assert r.status == "ok" and r.stdout == "fresh\n", r
    asyncio.run(ex.close())


async def test_a_cancelled_call_never_answers_the_next_one():
    ex = small_pool()
    try:
        with pytest.raises(TimeoutError):  # e.g. the tool layer's own timeout fires first
            await asyncio.wait_for(ex.execute("import time\ntime.sleep(1)\nprint('stale')"), 0.3)
        r = await ex.execute("print('mine')")
        assert r.status == "ok" and r.stdout == "mine\n", r
    finally:
        await ex.close()


@pytest.mark.parametrize("ready", [False, True])
def test_only_a_child_that_dies_before_it_is_ready_is_a_sandbox_error(ready):
    ctl_r, ctl_w = os.pipe()
    res_r, res_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a child whose set-up fails, or whose "code" exits after the ready frame
        if ready:
            proto.write_frame(res_w, {"ready": True})
            proto.read_frame(ctl_r)
        os._exit(70)
    for fd in (ctl_r, res_w, out_w, err_w):
        os.close(fd)
    for fd in (res_r, out_r, err_r):
        os.set_blocking(fd, False)
    child = Child(pid, None, ctl_w, res_r, out_r, err_r, None, "/", persistent=False)
    result = supervise(child, "pass", 5.0, LIMITS.to_dict())
    child.close()
    assert result["status"] == ("error" if ready else "sandbox_error"), result
    assert not child.alive


async def test_each_call_draws_its_own_random_numbers():
    """Children forked from one worker must not replay the worker's np.random or random state
    (the worker forks through libc, so Python's at-fork reseed of `random` does not run)."""
    ex = ForkServerExecutor(LIMITS, workers=1)  # default preload and warm-up import np.random
    try:
        code = "import random, numpy as np\nprint(np.random.rand(), random.random())"
        draws = [(await ex.execute(code)).stdout.split() for _ in range(5)]
        assert all(len(d) == 2 for d in draws), draws
        assert len({d[0] for d in draws}) == 5, draws
        assert len({d[1] for d in draws}) == 5, draws
        session = [(await ex.execute(code, session_id="s")).stdout.split() for _ in range(3)]
        assert len({d[1] for d in session}) == 3, session
    finally:
        await ex.close()


async def test_threads_work_in_a_child_forked_without_python_hooks():
    """threading's after-fork reset is skipped; the child's main thread and new threads still work."""
    ex = ForkServerExecutor(LIMITS, workers=1)
    try:
        code = (
            "import threading\n"
            "out = []\n"
            "t = threading.Thread(target=lambda: out.append(threading.current_thread().name))\n"
            "t.start(); t.join()\n"
            "print(threading.current_thread() is threading.main_thread(), out, threading.active_count())"
        )
        for _ in range(2):
            result = await ex.execute(code)
            assert result.ok, result
            assert result.stdout.strip() == "True ['Thread-1 (<lambda>)'] 1", result
    finally:
        await ex.close()
