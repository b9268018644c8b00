"""The default local backend: a pool of preloaded fork-server workers, driven from asyncio.

Each worker is a separate interpreter (started with a clean environment, `python -I`) that has
imported numpy and sympy once and forks a hardened child per call (see `worker`). Calls go to
any idle worker, shared fairly between callers (episodes; see `fair`); a session is pinned to
the worker that holds its interpreter. A worker that dies or stops answering is restarted, and
the call in flight ends with `sandbox_error`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from looprl.sandbox import proto
from looprl.sandbox.base import ExecResult, Executor, IsolationLevel, IsolationReport, SandboxLimits
from looprl.sandbox.fair import FairQueue
from looprl.sandbox.isolation import child_env, kernel_probe
from looprl.sandbox.policy import WorkerConfig
from looprl.sandbox.workerproc import WorkerProcess

logger = logging.getLogger("looprl.sandbox")

_GRACE = 10.0  # seconds a worker may take beyond the call's timeout before it counts as hung
_UID_SPAN = 65536

PROBE_CODE = r"""
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def attempt(fn):
    try:
        fn()
        return "allowed"
    except OSError as exc:
        return f"blocked ({errno.errorcode.get(exc.errno, exc.errno)})"
def ptrace():
    if libc.ptrace(16, os.getppid(), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "ptrace")
def write_outside():
    path = f"/tmp/.looprl-probe-{os.getpid()}"
    open(path, "w").close()
    os.unlink(path)
def spawn():
    os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0)
print(json.dumps({
    "uid": os.getuid(),
    "inet_socket": attempt(lambda: socket.socket().close()),
    "list_root_dir": attempt(lambda: os.listdir("/")),
    "write_tmp": attempt(write_outside),
    "exec": attempt(spawn),
    "signal_worker": attempt(lambda: os.kill(os.getppid(), 0)),
    "ptrace": attempt(ptrace),
    "seccomp_mode": libc.prctl(21, 0, 0, 0, 0),
    "no_new_privs": libc.prctl(39, 0, 0, 0, 0),
}))
"""


@dataclass
class _Session:
    worker: int
    uid: int
    generation: int
    last_used: float


class ForkServerExecutor(Executor):
    """Pre-forked, preloaded Linux sandbox pool (the default backend).

    Args:
        limits: Resource limits per call.
        workers: Worker processes, i.e. calls that run at once (default 2 x CPU cores, 2..16).
        preload: Modules each worker imports once so calls need not (numpy and sympy).
        lean_preload: A smaller preload list for a second template per worker: a call whose code
            does not name any module of `preload` missing from it (by default: does not
            contain "sympy") is forked from a template that imported only these (numpy), which
            is cheaper to fork and to exit. A call that imports sympy some other way still
            works, paying the import. None: one template with the whole `preload`.
        max_sessions: Open sessions kept; the least recently used is closed beyond that.
        session_idle_seconds: Sessions unused this long are closed.
        python: Interpreter for the workers (default: this one).
        namespaces: Let workers create mount/network/PID namespaces (off only for debugging).
        warmup: Run common numpy/sympy calls once per worker so children start with warm caches.
        freeze_sessions: Stop a session's interpreter between calls (SIGSTOP, SIGCONT before the
            next), so threads a cell left running use no CPU while no cell runs. False lets
            them run on between calls, spending the session's CPU budget: only to measure the
            cost of the stop (see docs/sandbox.md).
    """

    name = "forkserver"

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        workers: int | None = None,
        preload: tuple[str, ...] = ("numpy", "sympy"),
        lean_preload: tuple[str, ...] | None = ("numpy",),
        max_sessions: int = 256,
        session_idle_seconds: float = 900.0,
        python: str | None = None,
        namespaces: bool = True,
        warmup: bool = True,
        freeze_sessions: bool = True,
    ) -> None:
        super().__init__(limits)
        if sys.platform != "linux":
            raise RuntimeError(
                "ForkServerExecutor needs Linux; use SubprocessExecutor or HttpExecutor here"
            )
        self.n_workers = workers or min(16, max(2, 2 * (os.cpu_count() or 1)))
        self.preload = tuple(preload)
        self.lean_preload = None if lean_preload is None else tuple(lean_preload)
        self.max_sessions = max_sessions
        self.session_idle_seconds = session_idle_seconds
        self.python = python or sys.executable
        self.namespaces = namespaces
        self.warmup = warmup
        self.freeze_sessions = freeze_sessions
        self._uid_base = (1 << 20) + secrets.randbelow(30000) * _UID_SPAN
        self._uid_next = 2 * self.n_workers  # each worker's two stateless uids come first
        self._workers = [
            WorkerProcess(i, self._uid_base + i, self._uid_base + self.n_workers + i)
            for i in range(self.n_workers)
        ]
        self._sessions: dict[str, _Session] = {}
        self._evicted: dict[str, str] = {}
        self._slots = FairQueue(self.n_workers)  # one slot per worker, same index
        self._start_lock = asyncio.Lock()
        self._started = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scratch_root = ""
        self._report = IsolationReport(self.name, "weak", notes=["not started yet: call start()"])

    async def start(self) -> None:
        """Start the workers, probe the isolation from inside a sandbox and log the report.

        Used from another event loop than the one it started in (a second `asyncio.run`), the
        pool restarts itself there; open sessions are lost (their next call says so).
        """
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            self._adopt_loop()
        self._loop = loop
        if self._started:
            return
        async with self._start_lock:
            if self._started:
                return
            if self._closed:
                raise RuntimeError("this executor is closed; create a new one")
            self._scratch_root = tempfile.mkdtemp(prefix="looprl-sandbox-")
            os.chmod(self._scratch_root, 0o711)
            # removed even if close() is never called (workers exit when their stdin closes)
            weakref.finalize(self, shutil.rmtree, self._scratch_root, True)
            await asyncio.gather(*(self._start_worker(w) for w in self._workers))
            self._started = True
            probe = await self.execute(PROBE_CODE, timeout=30)
            self._report = self._build_report(probe)
            log = logger.info if self._report.level == "strong" else logger.warning
            log("%s", self._report.summary())

    def _adopt_loop(self) -> None:
        """Move to a new event loop: a fresh start lock (the slots reset themselves; workers are
        loop-agnostic, and a reply owed to a call cut off with the old loop is skipped by the
        next call)."""
        self._start_lock = asyncio.Lock()

    def _forget_sessions(self, w: WorkerProcess, why: str) -> None:
        for sid in [sid for sid, s in self._sessions.items() if s.worker == w.index]:
            self._evicted[sid] = why
            del self._sessions[sid]

    async def _start_worker(self, w: WorkerProcess) -> None:
        env = child_env("/")  # nothing of the trainer's environment
        config = WorkerConfig(
            limits=self.limits,
            scratch_root=self._scratch_root,
            preload=self.preload,
            lean_preload=self.lean_preload,
            warmup=self.warmup,
            namespaces=self.namespaces,
            freeze_sessions=self.freeze_sessions,
        )
        await w.start(self.python, config, env)

    def _build_report(self, probe: ExecResult) -> IsolationReport:
        features = {**kernel_probe(), **self._workers[0].features}
        verified: dict[str, Any] = {}
        notes = []
        try:
            verified = json.loads(probe.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            notes.append(
                f"the in-sandbox probe failed ({probe.status}: {probe.message}) {probe.stderr[-500:]}"
            )
        blocked = [
            k
            for k in (
                "inet_socket",
                "list_root_dir",
                "write_tmp",
                "exec",
                "signal_worker",
                "ptrace",
            )
            if str(verified.get(k, "")).startswith("blocked")
        ]
        strong = (
            len(blocked) == 6
            and isinstance(features.get("uid_drop"), str)
            and features["uid_drop"].startswith("unique")
        )
        if not features.get("root"):
            notes.append(
                "the worker is not root: sandboxes run as the trainer's uid (Landlock and seccomp still apply)"
            )
        if "pid" not in str(features.get("namespaces")):
            notes.append(
                "no PID namespace: processes that escape are found through the subreaper and /proc"
            )
        if features.get("landlock", "").startswith("unavailable"):
            notes.append(
                "no Landlock: files are protected only by uid, permissions and read-only mounts"
            )
        level: IsolationLevel = (
            "strong" if strong else ("partial" if "inet_socket" in blocked else "weak")
        )
        return IsolationReport(self.name, level, features, verified, notes)

    def isolation_report(self) -> IsolationReport:
        """The isolation in force (probed at `start()`); record `to_dict()` in run metadata."""
        return self._report

    def _allocate_uid(self) -> int:
        used = {s.uid for s in self._sessions.values()}
        used |= {w.uid for w in self._workers} | {w.lean_uid for w in self._workers}
        for _ in range(_UID_SPAN):
            self._uid_next = (self._uid_next + 1) % _UID_SPAN
            uid = self._uid_base + self._uid_next
            if uid not in used:
                return uid
        raise RuntimeError("no free sandbox uid: close sessions you no longer need")

    async def _acquire(self, caller: Hashable, index: int | None) -> WorkerProcess:
        """Wait for a worker (worker `index` when given), fairly between callers."""
        return self._workers[await self._slots.acquire(caller, index)]

    def _release(self, w: WorkerProcess, caller: Hashable) -> None:
        self._slots.release(w.index, caller)

    async def _session(self, session_id: str) -> tuple[_Session, str]:
        """The session record (created on first use) and a note if its state was lost earlier."""
        note = self._evicted.pop(session_id, "")
        sess = self._sessions.get(session_id)
        if sess is None:  # created before any await, so concurrent first calls share it
            counts = [
                sum(s.worker == w.index for s in self._sessions.values()) for w in self._workers
            ]
            index = counts.index(min(counts))
            uid = self._allocate_uid()
            sess = _Session(index, uid, self._workers[index].generation, time.monotonic())
            self._sessions[session_id] = sess
            await self._evict(keep=session_id)
        sess.last_used = time.monotonic()
        return sess, note

    async def _evict(self, keep: str) -> None:
        """Close sessions idle too long, then the least recently used beyond `max_sessions`."""
        now = time.monotonic()
        others = {sid: s for sid, s in self._sessions.items() if sid != keep}
        idle = [sid for sid, s in others.items() if now - s.last_used > self.session_idle_seconds]
        for sid in idle:
            await self.close_session(sid)
            self._evicted[sid] = (
                f"the session was closed after {self.session_idle_seconds:g} s idle"
            )
        while len(self._sessions) > self.max_sessions:
            sid = min(
                (k for k in self._sessions if k != keep), key=lambda k: self._sessions[k].last_used
            )
            await self.close_session(sid)
            self._evicted[sid] = (
                f"the session was closed (more than {self.max_sessions} open sessions)"
            )
        while len(self._evicted) > 4 * self.max_sessions:
            self._evicted.pop(next(iter(self._evicted)))

    async def _run(self, code: str, session_id: str | None, t: float, who: Hashable) -> ExecResult:
        """Run `code` in a fresh child, or in the session's interpreter when `session_id` is given."""
        await self.start()
        note, sess = "", None
        if session_id is None:
            w = await self._acquire(who, None)
        else:
            sess, note = await self._session(session_id)
            w = await self._acquire(who, sess.worker)
        try:
            if w.proc is None or w.broken:  # a failed restart, or a write cut off mid-frame
                await self._restart(w, keep=session_id)
            msg: dict[str, Any] = {"op": "exec", "code": code, "timeout": t}
            if sess is not None:
                if sess.generation != w.generation:
                    note = note or "the sandbox worker was restarted"
                    sess.generation = w.generation
                msg.update(op="session", sid=session_id, uid=sess.uid)
            reply = await asyncio.wait_for(w.call(msg, t + _GRACE), w.patience(t + _GRACE))
        except (TimeoutError, ConnectionError, RuntimeError, proto.ProtocolError) as exc:
            await self._restart(w)
            reason = str(exc) or "the worker did not answer in time"
            return ExecResult(
                "sandbox_error",
                message=f"sandbox infrastructure failure ({reason}); not the code's fault, retry",
            )
        finally:
            self._release(w, who)
        result = ExecResult.from_dict(reply)
        if session_id is not None:
            if session_id in self._sessions:
                self._sessions[session_id].last_used = time.monotonic()
            if note:
                result.session_reset = True
                result.message = (
                    f"Note: {note}; earlier variables are gone. " + result.message
                ).strip()
        return result

    async def _restart(self, w: WorkerProcess, keep: str | None = None) -> None:
        """Replace a dead or hung worker; its sessions are lost (`keep` stays registered)."""
        await w.stop()
        kept = self._sessions.pop(keep, None) if keep is not None else None
        self._forget_sessions(w, "the sandbox worker holding this session failed")
        if kept is not None and keep is not None:
            self._sessions[keep] = kept
        if not self._closed:
            try:
                await self._start_worker(w)
            except Exception as exc:  # noqa: BLE001 - keep the pool alive; the next call retries
                logger.error("could not restart sandbox worker %d: %s", w.index, exc)

    async def close_session(self, session_id: str) -> None:
        """Kill a session's interpreter and delete its scratch directory."""
        sess = self._sessions.pop(session_id, None)
        if sess is None or not self._started:
            return
        w = await self._acquire(session_id, sess.worker)
        try:
            if w.generation == sess.generation:
                msg = {"op": "close", "sid": session_id}
                await asyncio.wait_for(w.call(msg, _GRACE), w.patience(_GRACE))
        except (TimeoutError, ConnectionError, proto.ProtocolError):
            await self._restart(w)
        finally:
            self._release(w, session_id)

    async def close(self) -> None:
        """Stop every worker (killing all sandboxes) and remove the scratch root."""
        self._closed = True
        await asyncio.gather(*(w.stop() for w in self._workers))
        self._sessions.clear()
        if self._scratch_root:
            shutil.rmtree(self._scratch_root, ignore_errors=True)
        self._started = False
