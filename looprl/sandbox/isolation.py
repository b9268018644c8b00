"""Kernel isolation for the fork server: namespaces and mounts for a worker, hardening for a child.

A worker (started as root) moves into new mount, network and PID namespaces: it becomes PID 1 of
its own PID namespace (every sandbox process dies with it), sees no network interface at all,
mounts a fresh /proc that shows only its own processes, remounts every filesystem read-only in
its private mount table, hides directories other users cannot enter (such as /root) behind empty
tmpfs mounts while re-exposing the Python installation, and mounts a tmpfs on the scratch root.
A non-root worker tries the same inside a user namespace.

Each sandbox child then hardens itself before running any code: new session, clean environment,
resource limits with soft = hard, a unique unprivileged uid (when the worker is root),
no_new_privs, Landlock and the seccomp filter. Everything degrades gracefully; `features` says
what was actually achieved. Standard library only (plus the sibling ctypes modules).
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import shutil
import signal
import stat
import sys
from typing import Any

from looprl.sandbox import landlock, seccomp

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MS_OPTION_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": 1024,
    "nodiratime": 2048,
    "relatime": 1 << 21,
}
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
_SKIP_READONLY = ("/proc", "/sys", "/dev")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} failed: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2); OSError on failure."""
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def umount(target: str) -> None:
    """Lazy unmount (MNT_DETACH); OSError on failure."""
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def prctl(option: int, arg: int) -> None:
    """prctl(2) with one argument; OSError on failure."""
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def read_only_paths() -> list[str]:
    """What sandboxed code may read: the Python installation, system libraries, a few devices."""
    paths = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/localtime"]
    paths += ["/dev/urandom", "/dev/random", "/dev/zero", "/sys/devices/system/cpu"]
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    paths += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    seen: list[str] = []
    for p in paths:
        if p and os.path.exists(p) and p not in seen:
            seen.append(p)
    return seen


def kernel_probe() -> dict[str, Any]:
    """What the kernel and platform offer, before anything is attempted."""
    release = platform.release()
    return {
        "kernel": f"{platform.system()} {release} {platform.machine()}",
        "root": os.geteuid() == 0,
        "landlock_abi": landlock.abi_version() if sys.platform == "linux" else 0,
        "seccomp_arch_supported": seccomp.build_filter() is not None,
        "pidfd": hasattr(os, "pidfd_open"),
        "bubblewrap": shutil.which("bwrap") or "not installed",
    }


def enter_namespaces() -> dict[str, Any]:
    """Move this (worker) process into fresh namespaces and become PID 1 of the new PID namespace.

    The calling process forks: the parent waits for the child and exits with its status, so it
    never returns from here. Returns what was achieved, e.g. {"namespaces": "mnt,net,pid"}.
    """
    root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    wanted = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | (0 if root else CLONE_NEWUSER)
    try:
        _unshare(wanted)
        got = "mnt,net,pid" + ("" if root else ",user")
    except OSError as exc:
        return {"namespaces": f"none ({exc.strerror})"}
    if not root:
        try:
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
        except OSError as exc:
            got += f" (uid map failed: {exc.strerror})"
    pid = os.fork()
    if pid:  # the outer process only waits: the worker proper is PID 1 inside
        signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return {"namespaces": got}


def _not_traversable_ancestor(path: str) -> str | None:
    """The topmost ancestor of `path` that other users cannot enter (e.g. /root), if any."""
    parts = os.path.realpath(path).split("/")[1:-1]
    current = ""
    for part in parts:
        current += "/" + part
        if not os.stat(current).st_mode & stat.S_IXOTH:
            return current
    return None


def _expose(needed: list[str], features: dict[str, Any]) -> None:
    """Hide closed directories (mode without o+x) behind empty tmpfs; bind the needed paths back."""
    hidden: dict[str, list[str]] = {}
    for path in needed:
        anc = _not_traversable_ancestor(path)
        if anc is not None:
            hidden.setdefault(anc, []).append(os.path.realpath(path))
    for anc, paths in hidden.items():
        fds = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC)) for p in paths]
        mount("tmpfs", anc, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        for p, fd in fds:
            os.makedirs(p, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", p, None, MS_BIND | MS_REC)
            os.close(fd)
    if hidden:
        features["hidden_dirs"] = sorted(hidden)


def _remount_readonly() -> tuple[int, int]:
    """Bind-remount every mount read-only in this private mount table; (done, failed)."""
    done = failed = 0
    with open("/proc/self/mountinfo") as f:
        entries = [line.split() for line in f]
    for fields in entries:
        target = fields[4].encode().decode("unicode_escape")
        options = fields[5].split(",")
        if "ro" in options or target.startswith(_SKIP_READONLY):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in options:
            flags |= _MS_OPTION_FLAGS.get(opt, 0)
        try:
            mount(None, target, None, flags)
            done += 1
        except OSError:
            failed += 1
    return done, failed


def setup_mounts(scratch_root: str, needed: list[str]) -> dict[str, Any]:
    """Private mounts for the worker (inside its new mount namespace); returns what was achieved."""
    features: dict[str, Any] = {}
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError as exc:
        return {"mounts": f"unavailable ({exc.strerror})", "scratch_tmpfs": False}
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        features["private_proc"] = True
    except OSError as exc:
        features["private_proc"] = f"no ({exc.strerror})"
    try:
        _expose(needed, features)
    except OSError as exc:
        features["hidden_dirs"] = f"failed ({exc})"
    done, failed = _remount_readonly()
    features["readonly_mounts"] = f"{done} remounted read-only" + (f", {failed} failed" if failed else "")
    try:
        mount("tmpfs", scratch_root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0711,size=4m")
        features["scratch_tmpfs"] = True
    except OSError as exc:
        features["scratch_tmpfs"] = f"no ({exc.strerror})"
    return features


def make_scratch(path: str, uid: int | None, disk_mb: int, tmpfs: bool) -> None:
    """Create a scratch directory owned by `uid` (a size-limited tmpfs when `tmpfs`)."""
    os.mkdir(path, 0o700)
    if tmpfs:
        owner = f",uid={uid},gid={uid}" if uid is not None else ""
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={disk_mb}m,nr_inodes=4096,mode=0700{owner}")
    elif uid is not None:
        os.chown(path, uid, uid)


def remove_scratch(path: str, tmpfs: bool) -> None:
    """Undo `make_scratch` (errors ignored: the worker's tmpfs root is discarded at exit anyway)."""
    if tmpfs:
        try:
            umount(path)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)


def child_env(scratch: str) -> dict[str, str]:
    """The whole environment a sandbox child sees: nothing from the trainer."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8"}
    env.update({k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    return env


def set_limits(limits: dict[str, Any], baseline_vm: int, nproc_extra: int = 0) -> None:
    """Resource limits with soft = hard so the code cannot raise them again."""
    mb = 1024 * 1024
    pairs = [
        (resource.RLIMIT_AS, baseline_vm + int(limits["memory_mb"]) * mb),
        (resource.RLIMIT_NPROC, int(limits["max_processes"]) + nproc_extra),
        (resource.RLIMIT_FSIZE, int(limits["max_file_mb"]) * mb),
        (resource.RLIMIT_NOFILE, int(limits["max_open_files"])),
        (resource.RLIMIT_CORE, 0),
    ]
    for which, value in pairs:
        resource.setrlimit(which, (value, value))


def drop_privileges(uid: int) -> None:
    """Become `uid`/`uid` with no supplementary groups and no capabilities; die with the worker."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    prctl(PR_SET_DUMPABLE, 1)  # keeps /proc/<pid> owned by uid; ptrace stays blocked by seccomp
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def harden_child(policy: dict[str, Any], scratch: str, uid: int | None, persistent: bool) -> None:
    """Everything a forked child does to itself before it reads its first cell of code."""
    os.setsid()
    os.chdir(scratch)
    os.umask(0o077)
    os.environ.clear()
    os.environ.update(child_env(scratch))
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead
    limits = policy["limits"]
    set_limits(limits, policy["baseline_vm"], policy.get("nproc_extra", 0))
    if persistent:
        cpu = int(limits["session_cpu_seconds"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    if uid is not None:
        drop_privileges(uid)
    else:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if policy["landlock_abi"] > 0:
        landlock.apply(policy["read_only"], [scratch, "/dev/null"], policy["landlock_abi"])
    filt = policy.get("seccomp")
    if filt is not None:
        filt.install()
