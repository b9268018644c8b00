"""Supervise one cell in a sandbox child: send the code, read output under a cap, enforce the deadline.

Used by the fork-server worker and by the subprocess backend (in a thread). The child reports
its result as a frame on a result pipe; stdout and stderr are separate pipes read as they fill,
so a flood of output is cut at the cap instead of filling memory. The call ends when the result
arrives, the child dies, the output passes the hard cap, or the wall-clock deadline passes.
Standard library only.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from looprl.sandbox import proto

if TYPE_CHECKING:
    from looprl.sandbox.base import SandboxLimits

_HARD_CAP_SLACK = 64 * 1024  # output allowed past the in-process cap before the child is killed
_CHILD_STATUSES = {"ok", "error", "memory", "output_limit"}


class Child:
    """A sandbox child as its supervisor sees it: pid, pipes, uid and scratch directory.

    `reap` waits for the exited child when its parent is not the supervisor (a fork-server
    template's child) and returns (wait status, CPU seconds). A plain `__slots__` class: it
    changes during a call (`alive`, `reaped`, `ready`), and a worker makes one per call.
    """

    __slots__ = (
        "pid", "pidfd", "ctl", "res", "out", "err", "uid", "scratch", "persistent",
        "alive", "reaped", "ready", "reap",
    )  # fmt: skip

    def __init__(
        self,
        pid: int,
        pidfd: int | None,
        ctl: int,
        res: int,
        out: int,
        err: int,
        uid: int | None,
        scratch: str,
        persistent: bool,
        reap: Callable[[int], tuple[int, float]] | None = None,
    ) -> None:
        self.pid, self.pidfd, self.uid, self.scratch = pid, pidfd, uid, scratch
        self.ctl, self.res, self.out, self.err = ctl, res, out, err
        self.persistent = persistent
        self.alive = True
        self.reaped = False
        self.ready = False
        self.reap = reap

    def close(self) -> None:
        """Close every descriptor held for the child."""
        for fd in (self.pidfd, self.ctl, self.res, self.out, self.err):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.pidfd = self.ctl = self.res = self.out = self.err = -1


class _Call:
    """Bytes gathered during one call."""

    def __init__(self, cap: int) -> None:
        self.out = bytearray()
        self.err = bytearray()
        self.cap = cap
        self.frames = proto.FrameBuffer(max_frame=16 * 1024 * 1024)
        self.result: dict[str, Any] | None = None
        self.bad_frame = ""
        self.ready = False

    @property
    def over(self) -> bool:
        """True once stdout + stderr passed the hard cap."""
        return len(self.out) + len(self.err) > self.cap

    def feed_result(self, data: bytes) -> None:
        """Add bytes from the result pipe: note the child's "ready" frame, keep the first result."""
        try:
            frames = self.frames.feed(data)
        except proto.ProtocolError as exc:
            self.bad_frame = str(exc)
            return
        for frame in frames:
            if frame == {"ready": True} and not self.ready:
                self.ready = True
            elif self.result is None:
                self.result = frame if isinstance(frame, dict) else {"status": "?"}


def _read_into(fd: int, sink: bytearray | None, call: _Call) -> bool:
    """Read what is available; False at end of file."""
    try:
        data = os.read(fd, 1 << 16)
    except BlockingIOError:
        return True
    except OSError:
        return False
    if not data:
        return False
    if sink is None:
        call.feed_result(data)
    elif len(call.out) + len(call.err) <= call.cap:
        sink += data
    return True


def _drain(child: Child, call: _Call) -> None:
    """Read whatever is already in the pipes (bounded by the cap)."""
    for fd, sink in ((child.res, None), (child.out, call.out), (child.err, call.err)):
        for _ in range(1024):
            before = len(call.out) + len(call.err)
            try:
                data = os.read(fd, 1 << 16)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            if sink is None:
                call.feed_result(data)
            elif before <= call.cap:
                sink += data


def _send(child: Child, code: str, cpu_seconds: int) -> bool:
    """Hand the cell to the child; False if it is already gone."""
    try:
        proto.write_frame(child.ctl, {"code": code, "cpu_seconds": cpu_seconds})
    except OSError:
        return False
    if not child.persistent:
        os.close(child.ctl)
        child.ctl = -1
    return True


def _wait(child: Child, call: _Call, deadline: float) -> str:
    """Poll until the call ends; returns "result", "exited", "timeout", "output" or "protocol"."""
    poller = select.poll()
    sinks: dict[int, bytearray | None] = {child.res: None, child.out: call.out, child.err: call.err}
    for fd in sinks:
        poller.register(fd, select.POLLIN)
    if child.pidfd is not None:
        poller.register(child.pidfd, select.POLLIN)
    exited = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout"
        step = remaining if child.pidfd is not None else min(remaining, 0.01)
        for fd, _ in poller.poll(max(1, int(step * 1000))):
            if fd == child.pidfd:
                exited = True
                poller.unregister(fd)
            elif not _read_into(fd, sinks[fd], call):
                poller.unregister(fd)
        if child.pidfd is None and not exited and call.result is None:
            exited = _exited_nohang(child.pid)
        verdict = _verdict(child, call, exited)
        if verdict is not None:
            return verdict


def _verdict(child: Child, call: _Call, exited: bool) -> str | None:
    """How the call ended after a poll round, or None while it goes on."""
    if call.result is not None:
        _drain(child, call)  # output written before the result frame but not yet polled
        return "result"
    if call.bad_frame:
        return "protocol"
    if call.over:
        return "output"
    if exited:
        _drain(child, call)
        return "result" if call.result is not None else "exited"
    return None


def _exited_nohang(pid: int) -> bool:
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _death(child: Child, cpu_limit: int) -> tuple[str, str]:
    """Status and message for a child that died without reporting a result."""
    try:
        if child.reap is not None:
            status, cpu = child.reap(child.pid)
        else:
            _, status, usage = os.wait4(child.pid, 0)
            cpu = usage.ru_utime + usage.ru_stime
    except ChildProcessError:
        return "killed", "the sandbox process disappeared before finishing"
    child.reaped = True
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= cpu_limit - 0.5):
            return "timeout", f"the code used its {cpu_limit} s CPU-time limit and was stopped"
        if sig == signal.SIGSEGV:
            return (
                "killed",
                "the Python process crashed (SIGSEGV), e.g. recursion too deep or a bad ctypes call",
            )
        if sig == signal.SIGSYS:
            return "killed", "the code used a forbidden system call and was killed (SIGSYS)"
        return "killed", f"the process was killed by {name}"
    code = os.waitstatus_to_exitcode(status)
    return "error", f"the process exited with code {code} before the cell finished (os._exit?)"


def supervise(
    child: Child, code: str, timeout: float, limits: SandboxLimits, grace: float = 0.0
) -> dict[str, Any]:
    """Run one cell in `child` and return the result fields as a dict (see `ExecResult`).

    `grace` extends the deadline without changing the reported limit (for an interpreter that
    is still starting).
    Marks `child.alive = False` when the child died or had to be killed; the caller sweeps any
    processes the code left behind.
    """
    start = time.monotonic()
    cap = int(limits.max_output_bytes)
    call = _Call(cap + _HARD_CAP_SLACK)
    call.ready = child.ready
    cpu_limit = math.ceil(timeout) + 1
    outcome = (
        "exited"
        if not _send(child, code, cpu_limit)
        else _wait(child, call, start + timeout + grace)
    )
    child.ready = child.ready or call.ready
    status, message = "ok", ""
    if outcome == "result":
        assert call.result is not None
        status = call.result.get("status", "?")
        message = str(call.result.get("message") or "")
        if status not in _CHILD_STATUSES:
            status, message = "error", "the code tampered with the sandbox's result channel"
    elif outcome == "exited":
        child.alive = False
        status, message = _death(child, cpu_limit)
        if not child.ready:  # it died before any code ran: set-up failed, not the code
            status, message = (
                "sandbox_error",
                f"the sandbox failed to start ({message}); see stderr",
            )
    else:
        child.alive = False
        _kill(child.pid)
        status, message = {
            "timeout": (
                "timeout",
                f"the code ran longer than the {timeout:g} s time limit and was stopped",
            ),
            "output": ("output_limit", f"output passed the {cap}-byte limit; the run was stopped"),
            "protocol": ("error", "the code tampered with the sandbox's result channel"),
        }[outcome]
        if not child.ready:  # stuck before any code ran
            status, message = "sandbox_error", "the sandbox did not start in time"
    value = call.result.get("value") if call.result and outcome == "result" else None
    truncated = len(call.out) > cap or len(call.err) > cap or status == "output_limit"
    return {
        "status": status,
        "stdout": bytes(call.out[:cap]).decode("utf-8", "replace"),
        "stderr": bytes(call.err[:cap]).decode("utf-8", "replace"),
        "value": value if isinstance(value, str) else None,
        "duration": time.monotonic() - start,
        "message": message,
        "truncated": truncated,
        "session_reset": False,
    }


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def wait_gone(alive: Callable[[], bool], reap: Callable[[], None], limit: float = 2.0) -> bool:
    """Reap and poll until `alive()` is False (True) or `limit` seconds pass (False)."""
    end = time.monotonic() + limit
    delay = 0.0002
    while True:
        reap()
        if not alive():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
