"""The fork-server worker: supervises calls, each in a fresh, hardened child of a template.

Started by `ForkServerExecutor` as `python -I -c <bootstrap>`; it talks to the pool through
frames on stdin/stdout (see `proto`). After entering its namespaces it forks its *templates*
(see `template`): the processes that import the preload list and fork the children (a full one,
and a lean numpy-only one for calls that do not name sympy). The worker itself stays small and
shares no memory with any child. Each template keeps one *spare* child forked and hardened in
advance, so a call costs a pipe round trip instead of a fork. Each stateless call uses a spare
once; then the worker kills every process of that call's uid, deletes its scratch directory
(inside the worker's own size-limited tmpfs) and has the template fork the next spare, after
replying so that the pool does not wait for it. A session is a child that serves many cells,
with a tmpfs of its own; between cells it is stopped (SIGSTOP), so no thread of it runs while
no cell does.

Requests: {"op": "exec", "code", "timeout"}; {"op": "session", "sid", "uid", "code", "timeout"};
{"op": "close", "sid"}; {"op": "shutdown"}. Each is answered by one frame.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
from typing import Any, NoReturn

from looprl.sandbox import isolation, landlock, proto, seccomp
from looprl.sandbox.policy import ChildPolicy, WorkerConfig
from looprl.sandbox.supervise import Child, supervise, wait_gone
from looprl.sandbox.template import Template, TemplateGone, TemplateKind


class Kind:
    """A template as the worker runs it: what it is (`spec`), its stateless uid, its process and
    its spare child."""

    def __init__(self, spec: TemplateKind, uid: int | None) -> None:
        self.spec, self.uid = spec, uid
        self.template: Template | None = None
        self.spare: Child | None = None


class Worker:
    """State of one worker process: its policy, its templates' spare children and its sessions."""

    def __init__(self, config: WorkerConfig, features: dict[str, Any]) -> None:
        self.config = config
        self.limits = config.limits
        self.root = os.geteuid() == 0
        self.uid = config.uid if self.root else None
        self.scratch_root = config.scratch_root
        self.features = features
        self.tmpfs = features.get("scratch_tmpfs") is True
        # stateless calls' scratch dirs live here (one per worker: without namespaces they share a root)
        self.slot = os.path.join(self.scratch_root, f"w{os.getpid()}")
        isolation.make_scratch(self.slot, None, int(self.limits.disk_mb), self.tmpfs)
        os.chmod(self.slot, 0o711)
        # Not `isolation.kernel_probe()`: it imports shutil, which every template would inherit.
        abi, pidfd = landlock.abi_version(), hasattr(os, "pidfd_open")
        filt = seccomp.build_filter()
        self.policy = ChildPolicy(
            landlock_abi=abi,
            read_only=tuple(isolation.read_only_paths()),
            seccomp=filt,
            nproc_extra=0 if self.root else _count_own_processes() + 64,
        )
        features.update(
            uid_drop="unique uid per sandbox" if self.root else "no (worker is not root)",
            landlock=f"ABI {abi}" if abi else "unavailable",
            seccomp=f"{filt.length}-instruction filter ({filt.arch})" if filt else "unavailable",
            pidfd=pidfd,
        )
        self.heavy: tuple[str, ...] = ()  # modules only the full template imports
        self.kinds: dict[str, Kind] = {}  # "full" (and "lean"), set by `start_templates`
        self.last_child: Child | None = None
        self.last_kind: Kind | None = None
        self.sessions: dict[str, Child] = {}
        self.counter = 0
        self.freeze_sessions = config.freeze_sessions

    def start_templates(self) -> None:
        """Fork the template(s): the full preload list, and a lean one when `lean_preload` is a
        proper subset of it (as root, only with a uid of its own: never root, never the full
        spare's)."""
        preload, lean = self.config.preload, self.config.lean_preload
        lean_uid = self.config.lean_uid if self.root else None
        kinds = [self._kind("full", preload, self.uid)]
        if (
            lean is not None
            and set(lean) < set(preload)
            and (lean_uid is not None or not self.root)
        ):
            self.heavy = tuple(m for m in preload if m not in lean)
            kinds.append(self._kind("lean", tuple(m for m in preload if m in lean), lean_uid))
        for kind in kinds:
            kind.template = Template(self.policy, self.limits, kind.spec)
            self.kinds[kind.spec.name] = kind
        self.features.update(kinds[0].template.features if kinds[0].template else {})
        if self.heavy:
            self.features["lean_template"] = (
                f"{', '.join(kinds[1].spec.preload) or 'nothing'} preloaded, for calls that do not "
                f"mention {', '.join(self.heavy)}"
            )
        for kind in kinds:
            kind.spare = self.spawn_stateless(kind)

    def _kind(self, name: str, preload: tuple[str, ...], uid: int | None) -> Kind:
        """A kind with its own directory under the slot: a stateless call's scratch directory
        (the same path every call) lives in it, and its children's Landlock rule names it, so
        that one kind's call cannot reach the other kind's spare (they share a uid when the
        worker is not root). The rule is on the directory that stays, not on the scratch
        directory, which is created anew for every call."""
        home = os.path.join(self.slot, name)
        os.mkdir(home, 0o711)
        ruleset = None
        abi = self.policy.landlock_abi
        if abi:
            ruleset = landlock.build(self.policy.read_only, [home, "/dev/null"], abi)
        spec = TemplateKind(
            name,
            preload,
            os.path.join(home, "call"),
            ruleset,
            warmup=self.config.warmup,
            hugepages=self.config.hugepages,
        )
        return Kind(spec, uid)

    def kind_for(self, code: str) -> Kind:
        """The lean template unless the code names a module only the full one preloads."""
        if "lean" in self.kinds and not any(name in code for name in self.heavy):
            return self.kinds["lean"]
        return self.kinds["full"]

    def spawn_stateless(self, kind: Kind, reap: int | None = None) -> Child:
        """Fork a hardened child of `kind`'s template for one stateless call (after the template
        reaps its exited child `reap`, in the same round trip)."""
        isolation.make_scratch(kind.spec.scratch, kind.uid, 0, tmpfs=False)
        return self._spawn(kind, kind.uid, kind.spec.scratch, persistent=False, reap=reap)

    def spawn_session(self, uid: int | None) -> Child:
        """Fork a session's interpreter (always from the full template), with its own tmpfs."""
        self.counter += 1
        scratch = os.path.join(self.scratch_root, f"s{self.counter}")
        isolation.make_scratch(scratch, uid, int(self.limits.disk_mb), self.tmpfs)
        return self._spawn(self.kinds["full"], uid, scratch, persistent=True)

    def _spawn(
        self, kind: Kind, uid: int | None, scratch: str, persistent: bool, reap: int | None = None
    ) -> Child:
        """Have `kind`'s template fork a hardened child waiting for its first cell."""
        template = kind.template
        assert template is not None
        ctl_r, ctl_w = os.pipe()
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        fds = [os.open(os.devnull, os.O_RDONLY), out_w, err_w, res_w, ctl_r]
        try:
            pid = template.spawn(fds, scratch, uid, persistent, reap)
        except BaseException:
            for fd in (*fds, ctl_w, res_r, out_r, err_r):
                os.close(fd)
            raise
        os.close(fds[0])
        for fd in (ctl_r, res_w, out_w, err_w):
            os.close(fd)
        for fd in (res_r, out_r, err_r):
            os.set_blocking(fd, False)
        pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
        pipes = (ctl_w, res_r, out_r, err_r)
        return Child(pid, pidfd, *pipes, uid, scratch, persistent, reap=template.reap)

    def sweep(self, child: Child, keep_self: bool, reap: bool = True) -> None:
        """Kill everything the child's code started (and the child unless `keep_self`), then reap.

        `reap=False` leaves the killed child's own exit for its template to collect later (the
        next spawn request carries it); everything else is gone when this returns.
        """
        uid = child.uid
        if uid is not None and not keep_self:
            _kill_uid(uid)
            if reap:
                self._reap_child(child)  # blocks (no polling) until its exit is complete
            skip = -1 if child.reaped else child.pid
            wait_gone(
                lambda: _uid_alive(uid, skip), proto.reap_children
            )  # then anything it started
            return
        victims = _descendants(child.pid) | self._strays()
        if not keep_self:
            victims.add(child.pid)
        for pid in victims:
            _kill(pid)
        if not keep_self and reap:
            self._reap_child(child)
        wait_gone(lambda: any(_running(pid) for pid in victims), proto.reap_children)

    def _reap_child(self, child: Child) -> None:
        """Collect the child's exit through its template (its parent)."""
        if not child.reaped and child.reap is not None:
            with contextlib.suppress(ChildProcessError):
                child.reap(child.pid)
            child.reaped = True

    def _strays(self) -> set[int]:
        """Processes parented to this worker (escaped orphans) that are not spares or sessions."""
        known = {s.pid for s in self.sessions.values()}
        for kind in self.kinds.values():
            known |= {kind.spare.pid} if kind.spare else set()
            known |= {kind.template.pid} if kind.template else set()
        strays = set()
        for pid in _children(os.getpid()):
            if pid not in known:
                strays |= {pid} | _descendants(pid)
        return strays

    def discard(self, child: Child, reap: bool = True) -> None:
        """Kill a child and everything it started, close its pipes and remove its scratch."""
        self.sweep(child, keep_self=False, reap=reap)
        child.close()
        isolation.remove_scratch(child.scratch, self.tmpfs and child.persistent)

    def exec_stateless(self, req: dict[str, Any]) -> dict[str, Any]:
        """Run one cell in the spare child of the template it needs."""
        kind = self.kind_for(req["code"])
        child = kind.spare or self.spawn_stateless(kind)
        kind.spare = None
        self.last_child, self.last_kind = child, kind
        return supervise(child, req["code"], float(req["timeout"]), self.limits)

    def exec_session(self, req: dict[str, Any]) -> dict[str, Any]:
        """Run one cell in the session's interpreter (created on first use).

        Between cells the interpreter is stopped (SIGSTOP, then SIGCONT before the next cell),
        so threads a cell started cannot run, and spend the session's CPU budget, while no
        cell runs; the stop is sent before the reply, so the caller never sees a running one.
        """
        sid = req["sid"]
        child = self.sessions.get(sid)
        if child is None:
            uid = int(req["uid"]) if self.root else None
            child = self.sessions[sid] = self.spawn_session(uid)
        else:
            _signal(child.pid, signal.SIGCONT)
        result = supervise(child, req["code"], float(req["timeout"]), self.limits)
        if child.alive and self.freeze_sessions:
            _signal(child.pid, signal.SIGSTOP)
        if not child.alive:
            del self.sessions[sid]
            self.discard(child)
            result["session_reset"] = True
            result["message"] += (
                " The Python session was reset: variables, functions and imports from earlier calls are gone."
            )
        return result

    def after_exec(self, req: dict[str, Any]) -> None:
        """Clean-up that runs after the reply is sent: sweep, then fork the next spare."""
        pending: int | None = None  # the used child, for its template to reap with the next fork
        if req["op"] == "exec" and self.last_child is not None:
            child, self.last_child = self.last_child, None
            self.discard(child, reap=False)
            pending = None if child.reaped else child.pid
        elif req["op"] == "session" and req["sid"] in self.sessions:
            self.sweep(self.sessions[req["sid"]], keep_self=True)
        for kind in self.kinds.values():
            if kind.spare is None:
                reap = pending if kind is self.last_kind else None
                kind.spare = self.spawn_stateless(kind, reap)

    def close_session(self, sid: str) -> None:
        """Kill a session's interpreter and remove its scratch directory."""
        child = self.sessions.pop(sid, None)
        if child is not None:
            self.discard(child)

    def shutdown(self) -> None:
        """Kill every child (the PID namespace would do it too when this process exits)."""
        for sid in list(self.sessions):
            self.close_session(sid)
        for kind in self.kinds.values():
            if kind.spare is not None:
                self.discard(kind.spare)
                kind.spare = None
            if kind.template is not None:
                kind.template.close()

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        """Answer one request from the pool."""
        op = req.get("op")
        if op == "exec":
            return self.exec_stateless(req)
        if op == "session":
            return self.exec_session(req)
        if op == "close":
            self.close_session(req["sid"])
            return {"ok": True}
        raise ValueError(f"unknown worker op {op!r}")


def _kill(pid: int) -> None:
    _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    """Send `sig` to `pid`; a process that is already gone is ignored."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is `uid`: `kill(-1)` with only that uid's rights.

    Changing the effective uid clears the parent-death signal, so it is armed again after.
    """
    os.setresuid(uid, uid, 0)
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.setresuid(0, 0, 0)
        isolation.prctl(isolation.PR_SET_PDEATHSIG, signal.SIGKILL)


def _uid_alive(uid: int, skip: int = -1) -> bool:
    """True while some process (a zombie included) other than `skip` still runs as `uid`.

    Sandbox children stay dumpable, so /proc/<pid> is owned by their uid (zombies too).
    """
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != skip:
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    return True
            except OSError:
                continue
    return False


def _running(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")


def _ppid_map() -> dict[int, list[int]]:
    """parent pid -> child pids, from /proc (private to the worker's PID namespace when it has one)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    return children


def _children(pid: int) -> list[int]:
    return _ppid_map().get(pid, [])


def _descendants(pid: int) -> set[int]:
    tree = _ppid_map()
    found: set[int] = set()
    todo = list(tree.get(pid, []))
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo += tree.get(p, [])
    return found


def _count_own_processes() -> int:
    uid = os.getuid()
    return sum(1 for n in os.listdir("/proc") if n.isdigit() and _owner(n) == uid)


def _owner(name: str) -> int:
    try:
        return os.stat(f"/proc/{name}").st_uid
    except OSError:
        return -1


def main() -> None:
    """Entry point of a worker process (see the module docstring)."""
    frame = proto.read_frame(0)
    if frame is None:
        return
    config = WorkerConfig.from_dict(frame)
    features: dict[str, Any] = (
        isolation.enter_namespaces() if config.namespaces else {"namespaces": "off"}
    )
    namespaces = features["namespaces"]
    if namespaces.startswith(("mnt", "user")):
        root_pid_ns = namespaces.startswith("mnt,net,pid")
        mounts, scratch_root = isolation.setup_mounts(
            config.scratch_root, isolation.read_only_paths(), root_pid_ns
        )
        features.update(mounts)
        if scratch_root:
            config = dataclasses.replace(config, scratch_root=scratch_root)
    try:
        isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)
        features["subreaper"] = True
    except OSError:
        features["subreaper"] = False
    worker = Worker(config, features)
    worker.start_templates()  # they import the preload list, not this process
    proto.write_frame(1, {"op": "hello", "pid": os.getpid(), "features": features})
    serve_pool(worker)


def _exit_without_template(exc: TemplateGone) -> NoReturn:
    """Nothing more can be forked: exit, so the pool replaces this worker (and the call in
    flight ends in `sandbox_error`)."""
    sys.stderr.write(f"looprl sandbox worker: {exc}\n")
    os._exit(75)


def serve_pool(worker: Worker) -> None:
    """The request loop: read a frame, answer it, then clean up while the pool works."""
    while True:
        req = proto.read_frame(0)
        if req is None or req.get("op") == "shutdown":
            worker.shutdown()
            return
        start = time.monotonic()
        try:
            reply = worker.handle(req)
        except TemplateGone as exc:
            _exit_without_template(exc)
        except Exception as exc:  # noqa: BLE001 - report, never die, on a bad request
            reply = {
                "status": "sandbox_error",
                "message": f"worker error: {type(exc).__name__}: {exc}",
            }
        reply.setdefault("duration", time.monotonic() - start)
        proto.write_frame(1, reply)
        if req.get("op") in ("exec", "session"):
            try:
                worker.after_exec(req)
            except TemplateGone as exc:
                _exit_without_template(exc)
            except Exception as exc:  # noqa: BLE001 - a failed clean-up must not kill the worker
                sys.stderr.write(f"looprl sandbox worker: clean-up failed: {exc}\n")
