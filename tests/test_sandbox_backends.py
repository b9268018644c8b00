"""The other sandbox backends (plain subprocess, SandboxFusion-style HTTP) and the shared records."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from looprl.sandbox import (
    ExecResult,
    HttpExecutor,
    SandboxLimits,
    SubprocessExecutor,
    make_executor,
    proto,
)
from looprl.sandbox.fair import FairQueue
from looprl.sandbox.seccomp import _assemble, build_filter, denied_syscalls
from looprl.sandbox.subprocess_backend import unreachable_for_nobody

# ---------------------------------------------------------------- records and helpers


def test_exec_result_validates_status_and_round_trips():
    with pytest.raises(ValueError, match="unknown exec status"):
        ExecResult("exploded")  # type: ignore[arg-type]
    r = ExecResult("timeout", stdout="a", message="slow", session_reset=True)
    assert ExecResult.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert r.model_fault and not ExecResult("sandbox_error").model_fault and ExecResult("ok").ok


def test_limits_are_validated():
    with pytest.raises(ValueError, match="timeout"):
        SandboxLimits(timeout=0)
    with pytest.raises(ValueError, match="max_open_files"):
        SandboxLimits(max_open_files=3)
    assert SandboxLimits().cpu_seconds(2.5) == 4


def test_make_executor_rejects_unknown_backend():
    with pytest.raises(ValueError, match="unknown sandbox backend 'docker'"):
        make_executor("docker")


def test_frames_round_trip_and_reject_garbage():
    buf = proto.FrameBuffer()
    data = proto.encode({"a": "é"}) + proto.encode([1, 2])
    assert buf.feed(data[:5]) == []
    assert buf.feed(data[5:]) == [{"a": "é"}, [1, 2]]
    with pytest.raises(proto.ProtocolError, match="exceeds"):
        proto.FrameBuffer(max_frame=10).feed(proto.HEADER.pack(11) + b"x" * 11)
    with pytest.raises(proto.ProtocolError, match="not valid JSON"):
        proto.FrameBuffer().feed(proto.HEADER.pack(3) + b"{{{")


def test_seccomp_program_assembles_with_resolved_jumps():
    prog = _assemble([(0x15, "yes", 0, 7), (0x06, 0, 0, 0), "yes", (0x06, 0, 0, 1)])
    assert prog == [(0x15, 1, 0, 7), (0x06, 0, 0, 0), (0x06, 0, 0, 1)]
    assert build_filter("sparc") is None
    filt = build_filter("x86_64")
    assert filt is not None and filt.length > 50
    assert {"execve", "ptrace", "unshare", "bpf", "io_uring_setup"} <= set(
        denied_syscalls("x86_64")
    )


# ---------------------------------------------------------------- fair queueing of a pool's slots


async def test_fair_queue_serves_callers_in_turn_not_in_arrival_order():
    q = FairQueue(1)
    order: list[str] = []

    async def call(name: str, caller: str, slot: int | None = None) -> None:
        got = await q.acquire(caller, slot)
        order.append(name)
        await asyncio.sleep(0)  # hold the slot for a moment, as a call would
        q.release(got, caller)

    # a: a backlog of three; b and c: one call each, submitted after a's backlog
    names = [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("c1", "c")]
    await asyncio.gather(*(call(n, c) for n, c in names))
    assert order == ["a1", "b1", "c1", "a2", "a3"], order  # round robin, then a's own order
    assert q.waiting == 0 and not any(q.busy)


async def test_fair_queue_gives_a_slot_to_the_caller_with_fewest_running_calls():
    q = FairQueue(2)
    first = [await q.acquire("a"), await q.acquire("a")]  # a holds both slots
    waiting = [asyncio.create_task(q.acquire(c)) for c in ("a", "a", "b")]
    await asyncio.sleep(0)
    q.release(first[0], "a")
    await asyncio.sleep(0)
    assert [t.done() for t in waiting] == [False, False, True]  # b: none running, a: one
    with pytest.raises(ValueError, match="out of range"):
        await q.acquire("a", slot=2)


async def test_fair_queue_pinned_and_cancelled_waiters():
    q = FairQueue(2)
    held = await q.acquire("x", slot=0)
    pinned = asyncio.create_task(q.acquire("s", slot=0))  # a session: only slot 0 will do
    cancelled = asyncio.create_task(q.acquire("y", slot=0))
    await asyncio.sleep(0)
    assert not pinned.done() and await q.acquire("z") == 1  # the other slot is free
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    q.release(held, "x")
    assert await pinned == 0 and q.waiting == 0
    with pytest.raises(ValueError, match="at least one slot"):
        FairQueue(0)


# ---------------------------------------------------------------- subprocess backend


ROOT = os.geteuid() == 0


@pytest.fixture
async def sub(caplog):
    # as root with an interpreter nobody cannot reach (a pyenv under /root), the only way to
    # test this backend is as root: allowed here, where the code is the tests' own
    allow_root = ROOT and bool(unreachable_for_nobody(sys.executable))
    with caplog.at_level(logging.WARNING, logger="looprl.sandbox"):
        ex = SubprocessExecutor(
            SandboxLimits(timeout=5, memory_mb=256, max_output_bytes=4096), allow_root=allow_root
        )
    assert "WEAK sandbox" in caplog.text
    yield ex
    await ex.close()


@pytest.mark.skipif(not ROOT, reason="the refusal applies to a root trainer")
async def test_subprocess_backend_refuses_root_when_it_cannot_drop_privileges(caplog):
    # an interpreter nobody cannot reach: a wrapper in a directory only root may enter
    with tempfile.TemporaryDirectory() as private:  # mode 0700 under /tmp
        python = Path(private) / "python"
        python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        python.chmod(0o755)
        assert f"{python} (closed at {private})" in unreachable_for_nobody(str(python))
        await _refused_then_allowed(str(python), private, caplog)


async def _refused_then_allowed(python: str, private: str, caplog) -> None:
    with pytest.raises(PermissionError) as info:
        SubprocessExecutor(python=python)
    text = str(info.value)
    assert "refuses to run model code as root" in text and f"closed at {private}" in text
    assert "ForkServerExecutor" in text and "allow_root=True" in text
    with caplog.at_level(logging.WARNING, logger="looprl.sandbox"):
        ex = SubprocessExecutor(python=python, allow_root=True)
    try:
        assert "runs as ROOT" in caplog.text
        assert ex.isolation_report().features["uid_drop"].startswith("no: runs as ROOT")
        r = await ex.execute("import os\nos.geteuid()")
        assert (r.status, r.value) == ("ok", "0"), r  # what allow_root=True means
    finally:
        await ex.close()


async def test_subprocess_backend_runs_code_and_reports_failures(sub):
    r = await sub.execute("print(1)\n1 + 1")
    assert (r.status, r.stdout, r.value) == ("ok", "1\n", "2")
    r = await sub.execute("1/0")
    assert r.status == "error" and r.message == "ZeroDivisionError: division by zero"
    r = await sub.execute("while True: pass", timeout=0.5)
    assert r.status == "timeout", r
    r = await sub.execute("print('x' * 100_000)")
    assert r.status == "output_limit" and len(r.stdout) <= 4096
    r = await sub.execute("bytearray(10 * 1024**3)")
    assert r.status == "memory", r
    assert sub.isolation_report().level == "weak"


async def test_subprocess_backend_hides_environment_and_keeps_sessions(sub):
    os.environ["LOOPRL_SUB_SECRET"] = "hunter2"
    try:
        r = await sub.execute("import os\nprint(dict(os.environ))")
    finally:
        del os.environ["LOOPRL_SUB_SECRET"]
    assert r.ok and "hunter2" not in r.stdout
    dropped = sub.isolation_report().features["uid_drop"].startswith("nobody")
    r = await sub.execute("import os\nos.geteuid()")
    assert r.value == ("65534" if dropped else str(os.geteuid())), r
    assert (await sub.execute("x = 20", session_id="s")).ok
    assert (await sub.execute("x + 1", session_id="s")).value == "21"
    r = await sub.execute("while True: pass", session_id="s", timeout=0.5)
    assert r.status == "timeout" and r.session_reset
    assert (await sub.execute("x", session_id="s")).status == "error"


async def test_subprocess_backend_stops_a_session_between_calls(sub):
    spinner = (
        "import threading\ncount = 0\ndef spin():\n    global count\n    while True:\n"
        "        count += 1\nthreading.Thread(target=spin, daemon=True).start()"
    )
    assert (await sub.execute(spinner, session_id="spin")).ok
    pid = sub._sessions["spin"][0].pid
    stat = Path(f"/proc/{pid}/stat")
    end = time.monotonic() + 5
    while stat.read_text().split(") ")[1][0] != "T" and time.monotonic() < end:
        await asyncio.sleep(0.02)
    ticks = stat.read_text().split(") ")[1].split()[11:13]
    await asyncio.sleep(1.0)
    assert stat.read_text().split(") ")[1][0] == "T"  # stopped: no thread of it runs
    assert stat.read_text().split(") ")[1].split()[11:13] == ticks, "CPU used between calls"
    r = await sub.execute("count > 0", session_id="spin")
    assert (r.status, r.value) == ("ok", "True"), r


async def test_subprocess_backend_writes_bytes_through_sys_stdout_buffer(sub):
    code = "import sys\nprint('a')\nsys.stdout.buffer.write(b'b\\n')\nsys.stderr.buffer.write(b'e')"
    for sid in (None, "s"):
        r = await sub.execute(code, session_id=sid)
        assert (r.status, r.stdout, r.stderr) == ("ok", "a\nb\n", "e"), r


async def completion_order(ex, calls: list[tuple[str, str, str]]) -> list[str]:
    """Submit `(name, code, caller)` calls all at once; their names in the order they end."""
    done: list[str] = []

    async def one(name: str, code: str, caller: str) -> None:
        r = await ex.execute(code, caller=caller)
        assert r.ok, (name, r)
        done.append(name)

    await asyncio.gather(*(asyncio.create_task(one(*c)) for c in calls))
    return done


BACKLOG = [(f"long{i}", "import time\ntime.sleep(0.3)", "flood") for i in range(3)]
QUICK = ("quick", "print(1)", "other")


async def test_subprocess_backend_serves_a_quick_call_before_another_callers_backlog():
    ex = SubprocessExecutor(
        SandboxLimits(timeout=5),
        max_concurrency=1,
        allow_root=ROOT and bool(unreachable_for_nobody(sys.executable)),
    )
    try:
        assert await completion_order(ex, [*BACKLOG, QUICK]) == ["long0", "quick", "long1", "long2"]
    finally:
        await ex.close()


# ---------------------------------------------------------------- HTTP backend against a fake SandboxFusion


class _FakeSandboxFusion(BaseHTTPRequestHandler):
    """Answers POST /run_code like SandboxFusion, running the code with a local interpreter."""

    mode = "normal"
    requests: list[dict[str, Any]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        if self.path != "/run_code" or self.mode == "http_500":
            self.send_error(500, "boom")
            return
        if self.mode == "sandbox_error":
            answer: dict[str, Any] = {
                "status": "SandboxError",
                "message": "no executor pod",
                "run_result": None,
            }
        else:
            answer = self._run(body)
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _run(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            p = subprocess.run(
                [sys.executable, "-c", body["code"]],
                capture_output=True,
                text=True,
                timeout=body["run_timeout"],
            )
        except subprocess.TimeoutExpired:
            run = {"status": "TimeLimitExceeded", "return_code": None, "stdout": "", "stderr": ""}
            return {"status": "Failed", "message": "", "run_result": run}
        run = {
            "status": "Finished",
            "return_code": p.returncode,
            "stdout": p.stdout,
            "stderr": p.stderr,
        }
        return {
            "status": "Success" if p.returncode == 0 else "Failed",
            "message": "",
            "run_result": run,
        }


@pytest.fixture
def fake_server():
    _FakeSandboxFusion.mode = "normal"
    _FakeSandboxFusion.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSandboxFusion)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def test_http_backend_maps_sandboxfusion_answers(fake_server):
    ex = HttpExecutor(fake_server, SandboxLimits(timeout=5, max_output_bytes=2000))
    try:
        r = await ex.execute("print('hi')\n6 * 7")
        assert (r.status, r.stdout, r.value) == ("ok", "hi\n", "42"), r
        sent = _FakeSandboxFusion.requests[-1]
        assert sent["language"] == "python" and sent["run_timeout"] == 5
        r = await ex.execute("1/0")
        assert r.status == "error" and r.message == "ZeroDivisionError: division by zero"
        r = await ex.execute("raise MemoryError")
        assert r.status == "memory"
        r = await ex.execute("while True: pass", timeout=0.5)
        assert r.status == "timeout"
        r = await ex.execute("print('y' * 5000)")
        assert r.status == "output_limit" and len(r.stdout) <= 2000
        assert ex.isolation_report().level == "remote"
    finally:
        await ex.close()


async def test_http_backend_emulates_sessions_by_replay(fake_server):
    ex = HttpExecutor(fake_server)
    try:
        assert (await ex.execute("print('setup')\nb = 2", session_id="e")).stdout == "setup\n"
        await ex.execute("1/0", session_id="e")  # failed cells are not replayed
        r = await ex.execute("b * 21", session_id="e")
        assert (r.status, r.stdout, r.value) == ("ok", "", "42"), r
        await ex.close_session("e")
        assert (await ex.execute("b", session_id="e")).status == "error"
        # a cell that wrote bytes is replayed into a stream that has a buffer, like stdout
        code = "import sys\nsys.stdout.buffer.write(b'raw\\n')\nc = 3"
        assert (await ex.execute(code, session_id="f")).stdout == "raw\n"
        r = await ex.execute("print(c * 2)", session_id="f")
        assert (r.status, r.stdout) == ("ok", "6\n"), r
    finally:
        await ex.close()


async def test_http_backend_serves_a_quick_call_before_another_callers_backlog(fake_server):
    ex = HttpExecutor(fake_server, max_connections=1)
    try:
        assert await completion_order(ex, [*BACKLOG, QUICK]) == ["long0", "quick", "long1", "long2"]
    finally:
        await ex.close()


async def test_http_backend_infrastructure_failures_are_sandbox_errors(fake_server):
    ex = HttpExecutor(fake_server)
    try:
        _FakeSandboxFusion.mode = "sandbox_error"
        r = await ex.execute("print(1)")
        assert r.status == "sandbox_error" and "no executor pod" in r.message and not r.model_fault
        _FakeSandboxFusion.mode = "http_500"
        assert (await ex.execute("print(1)")).status == "sandbox_error"
    finally:
        await ex.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    down = HttpExecutor(f"http://127.0.0.1:{port}")
    try:
        r = await down.execute("print(1)")
        assert r.status == "sandbox_error" and "ConnectError" in r.message
    finally:
        await down.close()
    with pytest.raises(ValueError, match="http"):
        HttpExecutor("sandbox:8080")
