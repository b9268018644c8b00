"""The fork-server worker: a preloaded interpreter that runs each call in a fresh, hardened child.

Started by `ForkServerExecutor` as `python -I -c <bootstrap>`; it talks to the pool through
frames on stdin/stdout (see `proto`). After entering its namespaces and importing the preload
list (numpy, sympy), it keeps one *spare* child forked and hardened in advance, so a call costs
a pipe round trip instead of a fork. Each stateless call uses the spare once, then the worker
kills every process of that call's uid, deletes its scratch directory (inside the worker's own
size-limited tmpfs) and forks the next spare, after replying so that the pool does not wait for
it. A session is a child that serves many cells, with a tmpfs of its own.

Requests: {"op": "exec", "code", "timeout"}; {"op": "session", "sid", "uid", "code", "timeout"};
{"op": "close", "sid"}; {"op": "shutdown"}. Each is answered by one frame.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal
import sys
import time
from typing import Any

from looprl.sandbox import isolation, landlock, proto, runner, seccomp
from looprl.sandbox.supervise import Child, supervise, wait_gone


class Worker:
    """State of one worker process: its policy, its spare child and its sessions."""

    def __init__(self, config: dict[str, Any], features: dict[str, Any]) -> None:
        self.limits: dict[str, Any] = config["limits"]
        self.root = os.geteuid() == 0
        self.uid: int | None = config["uid"] if self.root else None
        self.scratch_root: str = config["scratch_root"]
        self.features = features
        self.tmpfs = features.get("scratch_tmpfs") is True
        self.slot = os.path.join(self.scratch_root, "w")  # stateless calls' scratch dirs live here
        isolation.make_scratch(self.slot, None, int(config["limits"]["disk_mb"]), self.tmpfs)
        os.chmod(self.slot, 0o711)
        probe = isolation.kernel_probe()
        filt = seccomp.build_filter()
        self.policy: dict[str, Any] = {
            "limits": self.limits,
            "landlock_abi": probe["landlock_abi"],
            "read_only": isolation.read_only_paths(),
            "seccomp": filt,
            "baseline_vm": 0,
            "nproc_extra": 0 if self.root else _count_own_processes() + 64,
        }
        features.update(
            uid_drop="unique uid per sandbox" if self.root else "no (worker is not root)",
            landlock=f"ABI {probe['landlock_abi']}" if probe["landlock_abi"] else "unavailable",
            seccomp=f"{filt.length}-instruction filter ({filt.arch})" if filt else "unavailable",
            pidfd=probe["pidfd"],
        )
        self.call_scratch = os.path.join(self.slot, "call")  # the same path for every call
        self.ruleset: int | None = None
        if probe["landlock_abi"]:
            rw = [self.slot, "/dev/null"]
            self.ruleset = landlock.build(self.policy["read_only"], rw, probe["landlock_abi"])
        self.spare: Child | None = None
        self.last_child: Child | None = None
        self.sessions: dict[str, Child] = {}
        self.counter = 0

    def _baseline_vm(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")

    def spawn(self, uid: int | None, persistent: bool) -> Child:
        """Fork a hardened child waiting for its first cell (a session when `persistent`)."""
        self.counter += 1
        if persistent:
            scratch = os.path.join(self.scratch_root, f"s{self.counter}")
            isolation.make_scratch(scratch, uid, int(self.limits["disk_mb"]), self.tmpfs)
        else:
            scratch = self.call_scratch
            isolation.make_scratch(scratch, uid, 0, tmpfs=False)
        self.policy["baseline_vm"] = self._baseline_vm()
        ctl_r, ctl_w = os.pipe()
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        fds = [os.open(os.devnull, os.O_RDONLY), out_w, err_w, res_w, ctl_r]
        ruleset = None if persistent else self.ruleset
        _reseed_numpy()  # here, not in the child: each child inherits a state of its own for free
        pid = isolation.fork_child()
        if pid == 0:  # the child: never returns
            _child_main(
                fds + ([ruleset] if ruleset is not None else []), self, scratch, uid, persistent
            )
        os.close(fds[0])
        for fd in (ctl_r, res_w, out_w, err_w):
            os.close(fd)
        for fd in (res_r, out_r, err_r):
            os.set_blocking(fd, False)
        pidfd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
        return Child(pid, pidfd, ctl_w, res_r, out_r, err_r, uid, scratch, persistent)

    def sweep(self, child: Child, keep_self: bool) -> None:
        """Kill everything the child's code started (and the child unless `keep_self`), then reap."""
        uid = child.uid
        if uid is not None and not keep_self:
            _kill_uid(uid)
            if not child.reaped:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(child.pid, 0)  # block (no polling) until its exit is complete
                child.reaped = True
            wait_gone(lambda: _uid_alive(uid), _reap)  # then anything it started
            return
        victims = _descendants(child.pid) | self._strays()
        if not keep_self:
            victims.add(child.pid)
        for pid in victims:
            _kill(pid)
        wait_gone(lambda: any(_running(pid) for pid in victims), _reap)

    def _strays(self) -> set[int]:
        """Processes parented to this worker (escaped orphans) that are not spares or sessions."""
        known = {s.pid for s in self.sessions.values()} | (
            {self.spare.pid} if self.spare else set()
        )
        strays = set()
        for pid in _children(os.getpid()):
            if pid not in known:
                strays |= {pid} | _descendants(pid)
        return strays

    def discard(self, child: Child) -> None:
        """Kill a child and everything it started, close its pipes and remove its scratch."""
        self.sweep(child, keep_self=False)
        child.close()
        isolation.remove_scratch(child.scratch, self.tmpfs and child.persistent)

    def exec_stateless(self, req: dict[str, Any]) -> dict[str, Any]:
        """Run one cell in the spare child."""
        child = self.spare or self.spawn(self.uid, persistent=False)
        self.spare = None
        self.last_child = child
        return supervise(child, req["code"], float(req["timeout"]), self.limits)

    def exec_session(self, req: dict[str, Any]) -> dict[str, Any]:
        """Run one cell in the session's interpreter (created on first use)."""
        sid = req["sid"]
        child = self.sessions.get(sid)
        if child is None:
            uid = int(req["uid"]) if self.root else None
            child = self.sessions[sid] = self.spawn(uid, persistent=True)
        result = supervise(child, req["code"], float(req["timeout"]), self.limits)
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
        if req["op"] == "exec" and self.last_child is not None:
            self.discard(self.last_child)
            self.last_child = None
        elif req["op"] == "session" and req["sid"] in self.sessions:
            self.sweep(self.sessions[req["sid"]], keep_self=True)
        if self.spare is None:
            self.spare = self.spawn(self.uid, persistent=False)

    def close_session(self, sid: str) -> None:
        """Kill a session's interpreter and remove its scratch directory."""
        child = self.sessions.pop(sid, None)
        if child is not None:
            self.discard(child)

    def shutdown(self) -> None:
        """Kill every child (the PID namespace would do it too when this process exits)."""
        for sid in list(self.sessions):
            self.close_session(sid)
        if self.spare is not None:
            self.discard(self.spare)
            self.spare = None

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


def _child_main(
    fds: list[int], worker: Worker, scratch: str, uid: int | None, persistent: bool
) -> None:
    """Body of a forked child: move fds into place, harden, serve cells; always os._exit.

    `fds` are stdin, stdout, stderr, result, control, and optionally a Landlock ruleset; they
    become descriptors 0, 1, 2, 3, 4 (and 5); every other descriptor is closed.
    """
    code = 70
    try:
        high = [os.dup(fd) for fd in fds]  # dups land above the originals, so no clobbering below
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        os.closerange(len(fds), 1 << 16)
        ruleset = 5 if len(fds) > 5 else None
        isolation.harden_child(worker.policy, scratch, uid, persistent, ruleset)
        code = 71
        runner.serve(worker.limits, persistent)
    except BaseException as exc:  # noqa: BLE001 - report any setup failure through stderr
        try:
            os.write(
                2, f"sandbox setup failed (stage {code}): {type(exc).__name__}: {exc}\n".encode()
            )
        finally:
            os._exit(code)
    os._exit(0)


def _reseed_numpy() -> None:
    """Give the next child its own numpy global random state (Python's `random` is reseeded by
    `isolation.fork_child`). Without it every call forked from one worker would draw the same
    `np.random` numbers.

    Run in the process that forks, just before each fork, with a fresh 32-bit seed from the OS:
    `np.random.seed()` (128 bits through SeedSequence) cost ~0.2 ms of CPU and ~115 page
    faults each time, the 32-bit path ~5 us. Two calls get the same numbers only if their
    seeds collide (about 1 in 4 billion per pair).
    """
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(int.from_bytes(os.urandom(4), "little"))


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


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


def _uid_alive(uid: int) -> bool:
    """True while some process (a zombie included) still runs as `uid`.

    Sandbox children stay dumpable, so /proc/<pid> is owned by their uid (zombies too).
    """
    for name in os.listdir("/proc"):
        if name.isdigit():
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


def _reap() -> None:
    """Collect every exited child, including orphans re-parented to this worker."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


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


WARMUP = {
    "numpy": (
        "import numpy as np\n"
        "np.linalg.det(np.eye(3)); np.linalg.solve(np.eye(2), np.ones(2)); np.linalg.eig(np.eye(2))\n"
        "np.random.default_rng(0).random(3); str(np.arange(3)); repr(np.float64(1.0))\n"
        "np.fft.fft(np.ones(4)); np.polyfit([0, 1, 2], [0, 1, 2], 1)\n"
    ),
    "sympy": (
        "import sympy as sp\n"
        "x = sp.Symbol('x')\n"
        "sp.factor(x**2 - 1); sp.expand((x + 1)**3); sp.simplify(sp.sin(x)**2 + sp.cos(x)**2)\n"
        "sp.solve(x**2 - 4, x); sp.solveset(x**2 - 1, x); sp.Rational(1, 3) + sp.Rational(1, 6)\n"
        "sp.nsimplify(0.5); sp.integrate(x**2, x); sp.diff(sp.sin(x), x); sp.Matrix([[1, 2], [3, 4]]).det()\n"
        "sp.sqrt(8); sp.latex(x**2); sp.sympify('x + 1'); sp.isprime(97); sp.N(sp.pi, 20); sp.gcd(12, 18)\n"
        "sp.binomial(5, 2); sp.limit(sp.sin(x) / x, x, 0); sp.series(sp.exp(x), x, 0, 3)\n"
    ),
}
"""Code run once per worker so the lazy imports and caches of common calls are shared by every child."""


def _preload(modules: list[str], warmup: bool) -> None:
    """Import the preload list, warm its common paths, then freeze the heap for the children."""
    for name in modules:
        importlib.import_module(name)
        if warmup and name in WARMUP:
            try:
                exec(WARMUP[name], {"__name__": "__warmup__"})
            except Exception as exc:  # noqa: BLE001 - a failed warm-up only costs speed
                sys.stderr.write(f"looprl sandbox worker: warm-up of {name} failed: {exc}\n")
    gc.collect()
    gc.freeze()  # keep the preloaded heap shared with the children (no copy-on-write by the GC)


def main() -> None:
    """Entry point of a worker process (see the module docstring)."""
    config = proto.read_frame(0)
    if config is None:
        return
    features: dict[str, Any] = (
        isolation.enter_namespaces() if config.get("namespaces", True) else {"namespaces": "off"}
    )
    namespaces = features["namespaces"]
    if namespaces.startswith(("mnt", "user")):
        root_pid_ns = namespaces.startswith("mnt,net,pid")
        mounts, scratch_root = isolation.setup_mounts(
            config["scratch_root"], isolation.read_only_paths(), root_pid_ns
        )
        features.update(mounts)
        config["scratch_root"] = scratch_root or config["scratch_root"]
    try:
        isolation.prctl(isolation.PR_SET_CHILD_SUBREAPER, 1)
        features["subreaper"] = True
    except OSError:
        features["subreaper"] = False
    _preload(config.get("preload", []), config.get("warmup", True))
    if config.get("hugepages", True):
        features["hugepages"] = isolation.collapse_heap()
    worker = Worker(config, features)
    isolation.prepare_worker_process(worker.policy, worker.call_scratch)
    worker.spare = worker.spawn(worker.uid, persistent=False)
    proto.write_frame(1, {"op": "hello", "pid": os.getpid(), "features": features})
    serve_pool(worker)


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
            except Exception as exc:  # noqa: BLE001 - a failed clean-up must not kill the worker
                sys.stderr.write(f"looprl sandbox worker: clean-up failed: {exc}\n")
