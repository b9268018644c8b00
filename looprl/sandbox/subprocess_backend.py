"""A plain subprocess backend for platforms without the fork server's kernel features.

Each call starts a fresh `python -I` with a clean environment, its own session and a temporary
working directory, resource limits (soft = hard) and a wall-clock kill of its process group;
output is capped while it is read. It has NO network isolation, NO file-access restriction and
no sweep for processes that leave the process group, and it pays an interpreter start per call
(no preloaded numpy). It says so loudly. Prefer `ForkServerExecutor` on Linux, or a container
or remote service (`HttpExecutor`) elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from looprl.sandbox.base import ExecResult, Executor, IsolationReport, SandboxLimits
from looprl.sandbox.fair import FairQueue
from looprl.sandbox.isolation import child_env
from looprl.sandbox.supervise import Child, supervise
from looprl.sandbox.workerproc import PACKAGE_ROOT

logger = logging.getLogger("looprl.sandbox")

_BOOTSTRAP = """
import json, os, sys, types
for name, sub in (("looprl", "/looprl"), ("looprl.sandbox", "/looprl/sandbox")):
    module = types.ModuleType(name)
    module.__path__ = [sys.argv[1] + sub]
    sys.modules[name] = module
from looprl.sandbox import isolation, runner
from looprl.sandbox.base import SandboxLimits
cfg = json.loads(sys.argv[2])
limits = SandboxLimits.from_dict(cfg["limits"])
try:
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
except OSError:  # no /proc (macOS): no address-space limit
    vm = None
isolation.set_limits(limits, vm, cfg["nproc_extra"])
import resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
if cfg["persistent"]:
    cpu = int(limits.session_cpu_seconds)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
fds = cfg["fds"]
runner.serve(limits, cfg["persistent"], res_fd=fds[0], ctl_fd=fds[1])
"""
_NOBODY = 65534


def _closed_directory(path: str) -> str | None:
    """The first directory on the way to `path` (or `path` itself) that other users cannot
    enter (no execute bit for others); None if they can reach it."""
    current = ""
    for part in os.path.realpath(path).split("/")[1:]:
        current += "/" + part
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return current
    return None


def unreachable_for_nobody(python: str) -> list[str]:
    """What keeps a child dropped to user nobody from running: "<path> (closed at <dir>)" for
    each needed path that nobody cannot reach (empty: it can run).

    Needed: the interpreter, this Python's prefixes (the installed libraries) and the looprl
    package the bootstrap imports. A directory on the way without the others' execute bit (an
    interpreter under a 0700 `/root`, say) closes the path.
    """
    paths = dict.fromkeys(
        (shutil.which(python) or python, sys.prefix, sys.base_prefix, PACKAGE_ROOT)
    )
    closed = {p: _closed_directory(p) for p in paths}
    return [f"{p} (closed at {d})" for p, d in closed.items() if d is not None]


def _signal_group(pid: int, sig: int) -> None:
    """Send `sig` to a session's interpreter and its process group (what it forked and kept in
    the group); processes already gone are ignored."""
    for send in (os.kill, os.killpg):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            send(pid, sig)


class SubprocessExecutor(Executor):
    """A fresh `python -I` per call (or per session), with rlimits and a timeout. Weak isolation.

    A session's interpreter (and its process group) is stopped between calls, so threads or
    processes a cell left running use no CPU while no cell runs. As root, each child drops to
    user nobody. When it cannot (nobody cannot reach the
    interpreter, its libraries or looprl, see `unreachable_for_nobody`), the constructor raises
    PermissionError instead of running model code as root, unless `allow_root=True`.

    Args:
        limits: Resource limits per call.
        max_concurrency: Calls that run at once (shared fairly between callers, see `fair`).
        python: Interpreter to run (default: this one).
        allow_root: Run the code as root when the trainer is root and cannot drop to nobody.
            Root code can rename the host, kill the trainer and read or write every file: only
            inside a throwaway container that holds nothing else.
    """

    name = "subprocess"

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        max_concurrency: int = 8,
        python: str | None = None,
        allow_root: bool = False,
    ) -> None:
        super().__init__(limits)
        self.python = python or sys.executable
        self._threads = ThreadPoolExecutor(
            max_workers=max_concurrency, thread_name_prefix="looprl-sandbox"
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = FairQueue(max_concurrency)
        self._sessions: dict[str, tuple[subprocess.Popen[bytes], Child, asyncio.Lock]] = {}
        root = os.geteuid() == 0
        blocked = unreachable_for_nobody(self.python) if root else []
        if blocked and not allow_root:
            raise PermissionError(
                "SubprocessExecutor refuses to run model code as root: the trainer is root and "
                f"cannot drop the code to user nobody ({_NOBODY}), who cannot reach "
                f"{'; '.join(blocked)} (a directory on the way lacks the others' execute bit, e.g. "
                "a Python under /root). Root code can rename the host, kill the trainer and read "
                "every file. Use ForkServerExecutor (a uid of its own per sandbox), or a Python "
                "and project that nobody can reach (chmod o+x on those directories, or a Python "
                "under /usr or /opt), or run the trainer as a non-root user; only inside a "
                "throwaway container, pass allow_root=True."
            )
        self._drop = root and not blocked
        self._as_root = root and not self._drop
        logger.warning(
            "SubprocessExecutor is a WEAK sandbox: no network isolation, no file-access restriction, "
            "no process sweep%s. Use ForkServerExecutor on Linux, or a container/remote sandbox.",
            ", and the code runs as ROOT (allow_root=True)"
            if self._as_root
            else ("" if self._drop else ", and the code runs as the trainer's own user"),
        )

    def isolation_report(self) -> IsolationReport:
        """Always `weak`: only rlimits, a clean environment, a new session and a timeout."""
        return IsolationReport(
            self.name,
            "weak",
            {
                "uid_drop": f"nobody ({_NOBODY})"
                if self._drop
                else ("no: runs as ROOT (allow_root=True)" if self._as_root else "no"),
                "rlimits": "soft = hard: CPU, address space, processes, file size, open files",
                "network": "NOT isolated",
                "files": "NOT restricted (cwd is a temporary directory)",
                "process_sweep": "process group only",
            },
            notes=["weak backend: use only for trusted code or inside a container"],
        )

    def _spawn(self, persistent: bool) -> tuple[subprocess.Popen[bytes], Child]:
        scratch = tempfile.mkdtemp(prefix="looprl-sub-")
        ctl_r, ctl_w = os.pipe()
        res_r, res_w = os.pipe()
        cfg = {
            "limits": self.limits.to_dict(),
            "persistent": persistent,
            "fds": [res_w, ctl_r],
            "nproc_extra": 1024,  # shared uid: the process limit is only a loose cap here
        }
        if self._drop:
            os.chown(scratch, _NOBODY, _NOBODY)
        proc = subprocess.Popen(
            [self.python, "-I", "-c", _BOOTSTRAP, PACKAGE_ROOT, json.dumps(cfg)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(res_w, ctl_r), cwd=scratch, env=child_env(scratch), start_new_session=True,
            user=_NOBODY if self._drop else None, group=_NOBODY if self._drop else None,
            extra_groups=[] if self._drop else None,
        )  # fmt: skip
        os.close(ctl_r)
        os.close(res_w)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.fileno(), proc.stderr.fileno()
        for fd in (res_r, out, err):
            os.set_blocking(fd, False)
        pidfd = os.pidfd_open(proc.pid) if hasattr(os, "pidfd_open") else None
        return proc, Child(proc.pid, pidfd, ctl_w, res_r, out, err, None, scratch, persistent)

    def _finish(self, proc: subprocess.Popen[bytes], child: Child) -> None:
        """Kill the process group, reap, close pipes, delete the temporary directory."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
            proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        child.out = child.err = -1
        child.close()
        shutil.rmtree(child.scratch, ignore_errors=True)

    def _run_once(self, code: str, timeout: float) -> dict[str, Any]:
        proc, child = self._spawn(persistent=False)
        try:
            # the interpreter start-up is not the code's time: allow it on top of the timeout
            return supervise(child, code, timeout, self.limits, grace=2.0)
        finally:
            self._finish(proc, child)

    async def _run(self, code: str, session_id: str | None, t: float, who: Hashable) -> ExecResult:
        """Run `code` in a new interpreter, or in the session's interpreter."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # asyncio primitives belong to one loop: renew them
            self._loop = loop
            self._sessions = {
                sid: (p, c, asyncio.Lock()) for sid, (p, c, _) in self._sessions.items()
            }
        slot = await self._slots.acquire(who)
        try:
            if session_id is None:
                reply = await loop.run_in_executor(self._threads, self._run_once, code, t)
            else:
                reply = await self._run_session(session_id, code, t)
        except OSError as exc:
            return ExecResult(
                "sandbox_error", message=f"could not start the sandbox process: {exc}"
            )
        finally:
            self._slots.release(slot, who)
        return ExecResult.from_dict(reply)

    async def _run_session(self, session_id: str, code: str, timeout: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        startup = 0.0
        if session_id not in self._sessions:
            proc, child = await loop.run_in_executor(self._threads, self._spawn, True)
            self._sessions[session_id] = (proc, child, asyncio.Lock())
            startup = 2.0  # the interpreter start-up is not the code's time
        proc, child, lock = self._sessions[session_id]
        async with lock:
            _signal_group(proc.pid, signal.SIGCONT)
            reply = await loop.run_in_executor(
                self._threads, supervise, child, code, timeout, self.limits, startup
            )
            if child.alive:  # nothing of the session runs between calls (threads included)
                _signal_group(proc.pid, signal.SIGSTOP)
        if not child.alive:
            self._sessions.pop(session_id, None)
            await loop.run_in_executor(self._threads, self._finish, proc, child)
            reply["session_reset"] = True
            reply["message"] += (
                " The Python session was reset: variables from earlier calls are gone."
            )
        return reply

    async def close_session(self, session_id: str) -> None:
        """Kill the session's interpreter."""
        entry = self._sessions.pop(session_id, None)
        if entry is not None:
            await asyncio.get_running_loop().run_in_executor(
                self._threads, self._finish, entry[0], entry[1]
            )

    async def close(self) -> None:
        """Kill every session and stop the thread pool."""
        for sid in list(self._sessions):
            await self.close_session(sid)
        self._threads.shutdown(wait=False)
