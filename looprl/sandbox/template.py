"""The template: the process that holds the preloaded heap and forks every sandbox child.

A worker (see `worker`) forks its templates once, before importing anything heavy. A template
imports its preload list (numpy and sympy; numpy alone for the lean one), freezes and
huge-page-backs its heap, installs the seccomp filter on itself, and then does nothing but fork
children on request. Keeping the worker's own work (supervising calls, sweeping, scratch
directories) out of this process is what makes each fork cheap: after a fork every page the
forking process writes is a copy-on-write fault, and the worker's Python wrote ~280 pages a
call when it also forked; the template's short loop writes ~130, and the worker none.

The worker talks to it over a SEQPACKET socket pair:
  spawn: b"S<uid>|<persistent>|<reap>|<scratch>" with the child's five descriptors attached
         -> b"<pid>" (the child is hardened and waits for its first cell); first, when <reap>
         is a pid, the template collects that (killed) child, saving a round trip per call
  reap:  b"R<pid>" -> b"<wait status> <cpu seconds>" once that child has exited
  end of file: the template exits.
The children are the template's, so it reaps them and reports how they ended; their pidfds,
pipes and uids are the worker's to watch.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import gc
import importlib
import json
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

from looprl.sandbox import isolation, runner
from looprl.sandbox.base import SandboxLimits
from looprl.sandbox.policy import ChildPolicy

_FDS = 6  # descriptors a spawn request may carry
_TIMEOUT = 60.0  # seconds the worker waits for an answer before it gives up on its template


class TemplateGone(Exception):
    """The template process died or stopped answering (the worker cannot fork any more)."""


@dataclass(frozen=True)
class TemplateKind:
    """What one template preloads, and where its stateless children work."""

    name: str
    """"full" (the whole preload list) or "lean" (a subset, for calls that do not need it)."""
    preload: tuple[str, ...]
    """Modules the template imports once, for every child to share."""
    scratch: str
    """The stateless children's scratch directory (the same path every call)."""
    ruleset: int | None
    """Landlock ruleset for stateless children: read-write access to this kind's directory only
    (None: no Landlock; a session's child builds its own)."""
    warmup: bool = True
    """Run common calls of the preloaded modules once (`WARMUP`), so caches are shared."""
    hugepages: bool = True
    """Back the template's heap with huge pages after the preload."""


class Template:
    """The worker's handle on its template process.

    `policy` and `limits` are what every child of it applies to itself; the template process
    completes its own copy of `policy` (its address-space size, the inherited seccomp filter).
    """

    def __init__(self, policy: ChildPolicy, limits: SandboxLimits, kind: TemplateKind) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the template: never returns
            ours.close()
            _template_main(theirs, policy, limits, kind)
        theirs.close()
        self.pid = pid
        self.sock = ours
        self.sock.settimeout(_TIMEOUT + 120.0)  # the first answer comes after the preload
        self.features: dict[str, Any] = json.loads(self._recv())
        self.sock.settimeout(_TIMEOUT)

    def _recv(self) -> bytes:
        try:
            data = self.sock.recv(1 << 16)
        except OSError as exc:
            raise TemplateGone(f"sandbox template stopped answering: {exc}") from exc
        if not data:
            raise TemplateGone("sandbox template exited")
        if data.startswith(b"E"):
            raise OSError(data[1:].decode("utf-8", "replace"))
        return data

    def spawn(
        self,
        fds: list[int],
        scratch: str,
        uid: int | None,
        persistent: bool,
        reap: int | None = None,
    ) -> int:
        """Have the template fork a hardened child on `fds` (after reaping its exited child
        `reap`); returns the new child's pid."""
        msg = f"S{'-' if uid is None else uid}|{int(persistent)}|{reap or '-'}|{scratch}".encode()
        try:
            socket.send_fds(self.sock, [msg], fds)
        except OSError as exc:
            raise TemplateGone(f"sandbox template is gone: {exc}") from exc
        return int(self._recv())

    def reap(self, pid: int) -> tuple[int, float]:
        """Wait for the template's child `pid` to exit; returns (wait status, CPU seconds).

        ChildProcessError if it is not (or no longer) the template's child.
        """
        try:
            self.sock.send(b"R%d" % pid)
        except OSError as exc:
            raise TemplateGone(f"sandbox template is gone: {exc}") from exc
        try:
            reply = self._recv()
        except OSError as exc:  # the template's "E" answer: not its child
            raise ChildProcessError(str(exc)) from exc
        status, cpu = reply.split()
        return int(status), float(cpu)

    def close(self) -> None:
        """End of file for the template, which then exits."""
        self.sock.close()


def _template_main(
    sock: socket.socket, policy: ChildPolicy, limits: SandboxLimits, kind: TemplateKind
) -> None:
    """Body of the template process: preload, then fork children on request; always os._exit."""
    code = 0
    try:
        isolation.prctl(isolation.PR_SET_PDEATHSIG, 9)  # SIGKILL when the worker dies
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1):  # the worker's frame pipes to the pool: never the template's to use
            os.dup2(null, fd)
        os.close(null)
        features: dict[str, Any] = {}
        runner.prepare_streams(limits)
        _preload(kind.preload, kind.warmup)
        if kind.hugepages:
            features["hugepages"] = isolation.collapse_heap()
        isolation.prepare_template_process(kind.scratch)
        # Measured once: reading it at every fork touched ~55 pages of the template (io objects).
        # The template's loop allocates nothing that stays, so its size does not drift.
        baseline_vm = _vm_size()
        if policy.seccomp is not None:
            # Installed once, here: every child inherits the filter before it runs a line of its
            # own, instead of each building and JIT-compiling it again (~0.5 ms of CPU a child).
            # Nothing the template does is on the filter's deny list.
            policy.seccomp.install()
        policy = dataclasses.replace(
            policy,
            baseline_vm=baseline_vm,
            seccomp_inherited=policy.seccomp is not None,
            prepared_scratch=kind.scratch,
        )
        sock.send(json.dumps(features).encode())
        _serve(sock, policy, limits, kind.ruleset)
    except BaseException as exc:  # noqa: BLE001 - say why, then exit; the worker exits too
        code = 70
        try:
            os.write(2, f"looprl sandbox template failed: {type(exc).__name__}: {exc}\n".encode())
        finally:
            os._exit(code)
    os._exit(code)


def _serve(
    sock: socket.socket, policy: ChildPolicy, limits: SandboxLimits, stateless_ruleset: int | None
) -> None:
    """The template's loop. Kept short on purpose: every page it writes is copied after a fork."""
    space = socket.CMSG_SPACE(_FDS * 4)
    while True:
        msg, ancdata, _, _ = sock.recvmsg(4096, space)
        if not msg:
            return
        if msg[0] == 0x52:  # b"R": reap
            try:
                _, status, usage = os.wait4(int(msg[1:]), 0)
                sock.send(b"%d %f" % (status, usage.ru_utime + usage.ru_stime))
            except ChildProcessError as exc:
                sock.send(b"E" + str(exc).encode())
            continue
        fds = array.array("i")
        for _level, _type, data in ancdata:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        uid_s, persistent_s, reap_s, scratch = msg[1:].decode().split("|", 3)
        if reap_s != "-":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(reap_s), 0)
        uid = None if uid_s == "-" else int(uid_s)
        persistent = persistent_s == "1"
        child_fds = list(fds)
        ruleset = None if persistent else stateless_ruleset
        if ruleset is not None:
            child_fds.append(ruleset)
        _reseed_numpy()  # here, not in the child: each child inherits a state of its own
        try:
            pid = isolation.fork_child()
        except OSError as exc:
            pid = -1
            sock.send(b"E" + str(exc).encode())
        if pid == 0:  # the child: never returns
            _child_main(child_fds, policy, limits, scratch, uid, persistent)
        for fd in fds:
            os.close(fd)
        if pid > 0:
            sock.send(b"%d" % pid)


def _vm_size() -> int:
    """This process's address-space size in bytes (a child's RLIMIT_AS is counted on top)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _child_main(
    fds: list[int],
    policy: ChildPolicy,
    limits: SandboxLimits,
    scratch: str,
    uid: int | None,
    persistent: bool,
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
        isolation.harden_child(policy, limits, scratch, uid, persistent, ruleset)
        code = 71
        runner.serve(limits, persistent)
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
"""Code run once per template so the lazy imports and caches of common calls are shared by every child."""


def _preload(modules: tuple[str, ...], warmup: bool) -> None:
    """Import the preload list, warm its common paths, then freeze the heap for the children."""
    for name in modules:
        importlib.import_module(name)
        if warmup and name in WARMUP:
            try:
                exec(WARMUP[name], {"__name__": "__warmup__"})
            except Exception as exc:  # noqa: BLE001 - a failed warm-up only costs speed
                sys.stderr.write(f"looprl sandbox template: warm-up of {name} failed: {exc}\n")
    gc.collect()
    gc.freeze()  # keep the preloaded heap shared with the children (no copy-on-write by the GC)
