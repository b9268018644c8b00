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
    result = supervise(child, "pass", 5.0, LIMITS)
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


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


async def test_a_dead_template_is_a_sandbox_error_then_replaced():
    """The template (the process that forks the sandboxes) dies under a call: the worker
    cannot fork any more, so it exits, the call is the infrastructure's fault, and a new
    worker takes over."""
    ex = small_pool()
    try:
        call = asyncio.create_task(ex.execute("import time\ntime.sleep(5)"))
        await asyncio.sleep(0.3)
        outer = ex._workers[0].proc
        assert outer is not None
        worker = outer.pid
        if ex._workers[0].features["namespaces"].startswith("mnt,net,pid"):
            (worker,) = _children(outer.pid)  # as root: PID 1 of its own PID namespace
        templates = _children(worker)
        assert templates
        for pid in templates:
            os.kill(pid, 9)
        r = await call
        assert r.status == "sandbox_error" and not r.model_fault, r
        assert (await ex.execute("print('back')")).stdout == "back\n"
    finally:
        await ex.close()


async def test_calls_that_do_not_name_sympy_fork_from_the_lean_template():
    """numpy-only template for code that does not mention sympy; the full one otherwise and
    for sessions; a hidden import still works; lean_preload=None keeps one template."""
    probe = "import sys\nprint(sorted(m for m in ('numpy', 'sym' 'py') if m in sys.modules))"
    ex = ForkServerExecutor(LIMITS, workers=1)
    try:
        assert (await ex.execute(probe)).stdout == "['numpy']\n"
        assert (await ex.execute(probe + "  # sympy")).stdout == "['numpy', 'sympy']\n"
        assert (await ex.execute(probe, session_id="s")).stdout == "['numpy', 'sympy']\n"
        hidden = await ex.execute("m = __import__('sym' + 'py')\nprint(m.Integer(2) + 1)")
        assert hidden.ok and hidden.stdout == "3\n", hidden
        assert "numpy preloaded" in ex.isolation_report().features["lean_template"]
    finally:
        await ex.close()
    single = ForkServerExecutor(LIMITS, workers=1, lean_preload=None)
    try:
        assert (await single.execute(probe)).stdout == "['numpy', 'sympy']\n"
        assert "lean_template" not in single.isolation_report().features
    finally:
        await single.close()


async def test_workers_without_namespaces_keep_their_scratch_apart():
    """Debug mode (no namespaces): workers share one scratch root, so each has its own slot."""
    ex = ForkServerExecutor(LIMITS, workers=2, preload=(), warmup=False, namespaces=False)
    try:
        code = "import os\nopen('f', 'w').write('x')\nprint(os.listdir('.'))"
        results = await asyncio.gather(*(ex.execute(code) for _ in range(6)))
        assert all(r.ok and r.stdout == "['f']\n" for r in results), results
    finally:
        await ex.close()


async def test_a_lean_call_cannot_reach_the_full_templates_spare():
    """The two spares wait in sibling directories; a call of one kind may not plant files for
    the next call of the other (their uids differ as root; Landlock also names one directory)."""
    ex = ForkServerExecutor(LIMITS, workers=1)
    try:
        plant = (
            "import os\n"
            "out = []\n"
            "for path in ('../../full/call/planted', '../../full/planted'):\n"
            "    try:\n"
            "        open(path, 'w').write('x')\n"
            "        out.append('written')\n"
            "    except OSError as exc:\n"
            "        out.append(type(exc).__name__)\n"
            "print(os.getcwd().rsplit('/', 2)[-2:], out)"
        )
        r = await ex.execute(plant)  # no "sympy" in the code: the lean template
        assert r.ok and "['lean', 'call']" in r.stdout and "written" not in r.stdout, r
        r = await ex.execute(
            "import os  # sympy\nprint(os.getcwd().rsplit('/', 2)[-2:], os.listdir('.'))"
        )
        assert r.ok and r.stdout == "['full', 'call'] []\n", r
    finally:
        await ex.close()


async def completion_order(ex, calls: list[tuple[str, str, dict]]) -> list[str]:
    """Submit `(name, code, kwargs)` calls all at once (in list order); their names as they end."""
    done: list[str] = []

    async def one(name: str, code: str, kwargs: dict) -> None:
        r = await ex.execute(code, **kwargs)
        assert r.ok, (name, r)
        done.append(name)

    await asyncio.gather(*(asyncio.create_task(one(*c)) for c in calls))
    return done


LONG = "import time\ntime.sleep(0.5)"


async def test_a_quick_call_does_not_wait_for_another_callers_backlog():
    """One worker, a backlog of four long calls from one episode, then a quick call of another:
    the quick call takes the worker as soon as the first long call ends (FIFO would put it
    last). Orderings, not times: with one worker the order is fixed whatever the load."""
    ex = small_pool()
    try:
        backlog = [(f"long{i}", LONG, {"caller": "flood"}) for i in range(4)]
        order = await completion_order(ex, [*backlog, ("quick", "print(1)", {"caller": "q"})])
        assert order == ["long0", "quick", "long1", "long2", "long3"], order
        # one caller's own calls keep their order (here: first come, first served)
        order = await completion_order(ex, [*backlog, ("quick", "print(1)", {"caller": "flood"})])
        assert order == ["long0", "long1", "long2", "long3", "quick"], order
        # a session's call is its episode's: it too overtakes another episode's backlog
        assert (await ex.execute("x = 1", session_id="ep")).ok
        order = await completion_order(ex, [*backlog, ("session", "x", {"session_id": "ep"})])
        assert order == ["long0", "session", "long1", "long2", "long3"], order
    finally:
        await ex.close()


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs a virtualenv to link to")
async def test_a_virtualenv_reached_through_a_symlink_is_in_the_minimal_root(tmp_path):
    """A virtualenv path that is a symlink (`.venv -> /elsewhere/venv`): the minimal root holds
    the link and binds what it leads to, so its site-packages import inside the sandbox."""
    os.symlink(sys.prefix, tmp_path / "venv")
    python = str(tmp_path / "venv" / "bin" / os.path.basename(sys.executable))
    ex = small_pool(python=python)
    try:
        r = await ex.execute("import sys, numpy\nprint(sys.prefix)")
        assert r.ok and r.stdout == f"{tmp_path / 'venv'}\n", r
    finally:
        await ex.close()
