"""Kernel isolation for the fork server: namespaces and mounts for a worker, hardening for a child.

A worker (started as root) moves into new mount, network and PID namespaces: it becomes PID 1 of
its own PID namespace (every sandbox process dies with it), sees no network interface at all,
and pivots into a minimal root that holds only the system libraries and the Python installation
(bound read-only), a few devices, a /proc of its own, and a tmpfs for scratch directories.
A non-root worker tries the same (without the PID namespace) inside a user namespace.

Each sandbox child then hardens itself before running any code: new session, clean environment,
resource limits with soft = hard, a unique unprivileged uid (when the worker is root),
no_new_privs, Landlock and the seccomp filter. Everything degrades gracefully; `features` says
what was actually achieved. Standard library only (plus the sibling ctypes modules).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys
from typing import TYPE_CHECKING, Any

from looprl.sandbox import landlock, seccomp

if TYPE_CHECKING:
    from looprl.sandbox.base import SandboxLimits
    from looprl.sandbox.policy import ChildPolicy

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what} failed: {os.strerror(err)}")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    """mount(2); OSError on failure."""
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def umount(target: str) -> None:
    """Lazy unmount (MNT_DETACH); OSError on failure."""
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def prctl(option: int, arg: int) -> None:
    """prctl(2) with one argument; OSError on failure."""
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


_libc_fork = ctypes.PyDLL(None, use_errno=True).fork  # PyDLL: the GIL stays held across the call
_libc_fork.restype = ctypes.c_int
_libc_fork.argtypes = []


def fork_child() -> int:
    """fork(2) for a single-threaded worker, without Python's at-fork hooks; returns 0 in the child.

    `os.fork()` runs every `os.register_at_fork` hook in each child (`threading`'s state reset,
    `random`'s reseed, whatever the preloaded libraries registered). That Python code touches
    pages all over the preloaded heap, and each page a child writes is copied: ~215 page faults,
    about 0.9 ms of CPU a child on this machine, before the child runs a line of its own. libc's
    fork skips them, which is sound here: the worker has one thread and holds no lock when it
    forks. The one hook whose effect matters, `random`'s reseed, is done before the fork
    instead, so each child still inherits a generator state of its own.
    """
    rand = sys.modules.get("random")
    if rand is not None:
        rand.seed()
    pid = _libc_fork()
    if pid < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"fork failed: {os.strerror(err)}")
    return pid


def _unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def read_only_paths() -> list[str]:
    """What sandboxed code may read: the Python installation, system libraries, a few devices."""
    paths = [
        "/usr",
        "/lib",
        "/lib64",
        "/lib32",
        "/bin",
        "/sbin",
        "/etc/ld.so.cache",
        "/etc/localtime",
    ]
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
    import shutil  # not at module level: see `remove_scratch`

    uname = os.uname()
    return {
        "kernel": f"{uname.sysname} {uname.release} {uname.machine}",
        "root": os.geteuid() == 0,
        "landlock_abi": landlock.abi_version() if sys.platform == "linux" else 0,
        "seccomp_arch_supported": seccomp.build_filter() is not None,
        "pidfd": hasattr(os, "pidfd_open"),
        "bubblewrap": shutil.which("bwrap") or "not installed",
    }


def enter_namespaces() -> dict[str, Any]:
    """Move this (worker) process into fresh namespaces; returns e.g. {"namespaces": "mnt,net,pid"}.

    As root: mount, network and PID namespaces, then a fork so that the worker proper is PID 1
    of the new PID namespace (the parent only waits and exits with the child's status: it never
    returns from here). Otherwise: user, mount and network namespaces, if the kernel allows.
    """
    root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    wanted = CLONE_NEWNS | CLONE_NEWNET | (CLONE_NEWPID if root else CLONE_NEWUSER)
    try:
        _unshare(wanted)
        got = "mnt,net,pid" if root else "user,mnt,net"
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
        return {"namespaces": got}
    pid = os.fork()
    if pid:  # the outer process only waits: the worker proper is PID 1 inside
        signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
        _, status = os.waitpid(pid, 0)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return {"namespaces": got}


def _statvfs_flags(path: str) -> int:
    """The mount flags of the filesystem holding `path` that a read-only rebind must keep."""
    flags = os.statvfs(path).f_flag
    keep = MS_NOSUID | MS_NODEV | MS_NOEXEC  # ST_* and MS_* share these bit values
    return (flags & keep) | (flags & 1024)  # ST_NOATIME == MS_NOATIME


def _bind_readonly(source: str, target: str) -> None:
    """Bind `source` (file or directory, recursively) at `target` and make the bind read-only."""
    if os.path.isdir(source):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        with open(target, "a"):
            pass
    mount(source, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _statvfs_flags(source))


def _mirror_links(newroot: str, path: str) -> str:
    """Recreate in `newroot` every symlink met on the way to `path` (a `/lib -> usr/lib`, a
    virtualenv that is a link to elsewhere); returns the resolved path, where the bind goes."""
    current = ""
    for part in path.strip("/").split("/"):
        current += "/" + part
        if os.path.islink(current):
            link = newroot + current
            if not os.path.lexists(link):
                os.makedirs(os.path.dirname(link), mode=0o755, exist_ok=True)
                os.symlink(os.readlink(current), link)
            current = os.path.realpath(current)
    return current


def _populate_root(newroot: str, needed: list[str], fresh_proc: bool) -> int:
    """Mirror each needed path into `newroot`: the symlinks on its way as symlinks, the
    directory or file they lead to as a read-only bind at its real path."""
    bound: list[str] = []
    for path in sorted(set(needed), key=lambda p: (len(os.path.realpath(p)), p)):
        real = _mirror_links(newroot, path)
        if any(real == b or real.startswith(b.rstrip("/") + "/") for b in bound):
            continue
        _bind_readonly(real, newroot + real)
        bound.append(real)
    os.makedirs(newroot + "/proc", mode=0o555)
    if fresh_proc:  # a /proc of our own PID namespace: only the worker's processes are listed
        mount("proc", newroot + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    else:
        mount("/proc", newroot + "/proc", None, MS_BIND | MS_REC)
    return len(bound)


def _pivot(newroot: str) -> None:
    """Make `newroot` the root of this mount namespace and detach the old root."""
    os.chdir(newroot)
    nr = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)
    if nr is None:
        raise OSError(f"pivot_root: unknown architecture {os.uname().machine}")
    _check(_libc.syscall(nr, b".", b"."), "pivot_root")
    umount(".")
    os.chdir("/")


def setup_mounts(
    staging: str, needed: list[str], fresh_proc: bool
) -> tuple[dict[str, Any], str | None]:
    """Give the worker a minimal, read-only root in its private mount namespace.

    The new root holds only `needed` (system libraries and the Python installation, bound
    read-only), /dev/{null,zero,random,urandom}, /proc, and a tmpfs at /scratch for the
    sandboxes' scratch directories. Everything else (home directories, /tmp, /run and its
    sockets, the project's files) does not exist for the sandbox. Returns what was achieved and
    the scratch root to use (None: keep using `staging` on the host's view).
    """
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    except OSError as exc:
        return {"filesystem_view": f"host (mounts unavailable: {exc.strerror})"}, None
    try:
        devices = [
            d
            for d in ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
            if os.path.exists(d)
        ]
        n = _populate_root(staging, needed + devices, fresh_proc)
        os.makedirs(staging + "/scratch", mode=0o711)
        mount("tmpfs", staging + "/scratch", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0711,size=4m")
        _pivot(staging)
    except OSError as exc:
        umount(staging)
        return {"filesystem_view": f"host (minimal root failed: {exc})"}, None
    proc = "own /proc" if fresh_proc else "host /proc (bound)"
    view = f"minimal read-only root ({n} binds), {proc}, tmpfs scratch"
    return {"filesystem_view": view, "scratch_tmpfs": True}, "/scratch"


def _anon_memory_kb() -> tuple[int, int]:
    """(anonymous, anonymous in huge pages) of this process, in kB."""
    values = {"Anonymous": 0, "AnonHugePages": 0}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key = line.split(":")[0]
            if key in values:
                values[key] = int(line.split()[1])
    return values["Anonymous"], values["AnonHugePages"]


def collapse_heap() -> str:
    """Back the worker's anonymous memory with huge pages (MADV_HUGEPAGE, MADV_COLLAPSE >= 6.1).

    Fewer page-table entries make each fork and each child's exit cheaper. Best effort; returns
    how much of the anonymous memory ended up in huge pages.
    """
    madvise = _libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    huge = 2 * 1024 * 1024
    with open("/proc/self/maps") as f:
        regions = [line.split() for line in f]
    for fields in regions:
        path = fields[5] if len(fields) > 5 else ""
        if not fields[1].startswith("rw") or path not in ("", "[heap]"):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        lo, hi = (lo + huge - 1) // huge * huge, hi // huge * huge
        if hi > lo and madvise(lo, hi - lo, 14) == 0:  # MADV_HUGEPAGE
            madvise(lo, hi - lo, 25)  # MADV_COLLAPSE (partial success still helps)
    try:
        anon, in_huge = _anon_memory_kb()
    except OSError:
        return "unknown"
    return f"{in_huge >> 10} of {anon >> 10} MB anonymous memory in huge pages"


def make_scratch(path: str, uid: int | None, disk_mb: int, tmpfs: bool) -> None:
    """Create a scratch directory owned by `uid` (a size-limited tmpfs when `tmpfs`)."""
    os.mkdir(path, 0o700)
    if tmpfs:
        owner = f",uid={uid},gid={uid}" if uid is not None else ""
        mount(
            "tmpfs",
            path,
            "tmpfs",
            MS_NOSUID | MS_NODEV,
            f"size={disk_mb}m,nr_inodes=4096,mode=0700{owner}",
        )
    elif uid is not None:
        os.chown(path, uid, uid)


def remove_scratch(path: str, tmpfs: bool) -> None:
    """Undo `make_scratch` (errors ignored: the worker's tmpfs root is discarded at exit anyway)."""
    if tmpfs:
        with contextlib.suppress(OSError):
            umount(path)
    try:
        os.rmdir(path)  # the common case, an empty directory: one syscall instead of a tree walk
    except OSError:
        import shutil  # here: the module (and bz2, lzma, zlib) would grow every template's heap

        shutil.rmtree(path, ignore_errors=True)


def child_env(scratch: str) -> dict[str, str]:
    """The whole environment a sandbox child sees: nothing from the trainer."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": scratch,
        "TMPDIR": scratch,
        "LANG": "C.UTF-8",
    }
    env.update({k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    return env


def set_limits(limits: SandboxLimits, baseline_vm: int | None, nproc_extra: int = 0) -> None:
    """Resource limits with soft = hard so the code cannot raise them again.

    The address-space limit is `baseline_vm` (the preloaded interpreter) plus `memory_mb`; it is
    skipped when the baseline is unknown.
    """
    mb = 1024 * 1024
    pairs = [
        (resource.RLIMIT_NPROC, int(limits.max_processes) + nproc_extra),
        (resource.RLIMIT_FSIZE, int(limits.max_file_mb) * mb),
        (resource.RLIMIT_NOFILE, int(limits.max_open_files)),
        (resource.RLIMIT_CORE, 0),
    ]
    if baseline_vm is not None:
        pairs.append((resource.RLIMIT_AS, baseline_vm + int(limits.memory_mb) * mb))
    for which, value in pairs:
        resource.setrlimit(which, (value, value))


def drop_privileges(uid: int) -> None:
    """Become `uid`/`uid` with no supplementary groups and no capabilities; die with the worker."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    prctl(PR_SET_DUMPABLE, 1)  # keeps /proc/<pid> owned by uid; ptrace stays blocked by seccomp
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


_CHILD_SIGNALS: dict[signal.Signals, Any] = {
    signal.SIGTERM: signal.SIG_DFL,
    signal.SIGCHLD: signal.SIG_DFL,
    signal.SIGHUP: signal.SIG_DFL,
    signal.SIGINT: signal.default_int_handler,
    signal.SIGXFSZ: signal.SIG_IGN,  # an oversized write fails with EFBIG instead of killing
}


def _set_env_and_signals(scratch: str) -> None:
    """The environment (`child_env`) and signal dispositions a sandbox child runs with."""
    os.environ.clear()
    os.environ.update(child_env(scratch))
    for sig, handler in _CHILD_SIGNALS.items():
        signal.signal(sig, handler)


def prepare_template_process(scratch: str) -> None:
    """Give a fork-server template the environment and signal dispositions its stateless
    children need, so that they inherit them instead of paying for them after every fork.

    The template then records `scratch` as its policy's `prepared_scratch`, so that
    `harden_child` skips that step for children whose scratch directory it is (doing it inside
    the child cost ~0.4 ms of CPU a call: Python code whose pages each child must copy,
    copy-on-write).
    """
    _set_env_and_signals(scratch)


def harden_child(
    policy: ChildPolicy,
    limits: SandboxLimits,
    scratch: str,
    uid: int | None,
    persistent: bool,
    ruleset_fd: int | None = None,
) -> None:
    """Everything a forked child does to itself before it reads its first cell of code.

    `policy` says how (Landlock, seccomp, what its template already did), `limits` how much
    (the rlimits). `ruleset_fd` is a Landlock ruleset prepared by the worker (stateless calls: one per template
    kind, inherited through the template); without it the child builds one for its own scratch
    directory (sessions).
    """
    os.setsid()
    os.chdir(scratch)
    os.umask(0o077)
    if scratch != policy.prepared_scratch:  # sessions; stateless children inherit both
        _set_env_and_signals(scratch)
    set_limits(limits, policy.baseline_vm, policy.nproc_extra)
    if persistent:
        cpu = int(limits.session_cpu_seconds)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    if uid is not None:
        drop_privileges(uid)
    else:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if ruleset_fd is not None:
        landlock.restrict_with(ruleset_fd)
    elif policy.landlock_abi > 0:
        landlock.apply(policy.read_only, [scratch, "/dev/null"], policy.landlock_abi)
    filt = policy.seccomp
    if filt is not None and not policy.seccomp_inherited:
        filt.install()  # otherwise in place since the fork: the template installed it once
