"""A small seccomp-BPF filter, built with ctypes, that denies the syscalls a sandbox never needs.

The filter (installed once in each fork-server template, so that every sandbox child has it
from its first instruction on) returns an error for:

- `socket()` of any family except AF_UNIX: no network, whatever namespaces exist;
- `execve` / `execveat`: no new programs (`/bin/sh`, compilers); the child only runs Python;
- `ptrace`, `process_vm_readv/writev`, `kcmp`, `pidfd_getfd`: no peeking into other processes;
- namespace and mount syscalls (`unshare`, `setns`, `mount`, `clone` with CLONE_NEW* flags, ...);
- kernel attack surface a calculator does not need (`bpf`, `io_uring_*`, `userfaultfd`,
  `perf_event_open`, keyrings, module loading, ...).

`clone3` answers ENOSYS so that libc falls back to `clone`, whose flags the filter can inspect.
A syscall from a foreign architecture (or the x32 ABI) kills the process. Only x86_64 and
aarch64 are known; elsewhere `build_filter` returns None and the isolation report says so.
"""

from __future__ import annotations

import ctypes
import errno
import os

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# Syscall numbers, checked against the kernel headers of each architecture.
# fmt: off
_NR: dict[str, dict[str, int]] = {
    "x86_64": {
        "socket": 41, "execve": 59, "execveat": 322, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "clone": 56, "clone3": 435,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163,
        "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159,
        "quotactl": 179, "open_by_handle_at": 304, "name_to_handle_at": 303,
        "fanotify_init": 300, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "open_tree": 428, "mount_setattr": 442, "kcmp": 312,
        "iopl": 172, "ioperm": 173, "syslog": 103, "vhangup": 153, "lookup_dcookie": 212,
        "pidfd_getfd": 438,
    },
    "aarch64": {
        "socket": 198, "execve": 221, "execveat": 281, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "keyctl": 219, "add_key": 217, "request_key": 218,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "clone": 220, "clone3": 435,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89,
        "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266, "adjtimex": 171,
        "quotactl": 60, "open_by_handle_at": 265, "name_to_handle_at": 264,
        "fanotify_init": 262, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "open_tree": 428, "mount_setattr": 442, "kcmp": 272,
        "syslog": 116, "vhangup": 58, "lookup_dcookie": 18, "pidfd_getfd": 438,
    },
}
# fmt: on
_SPECIAL = {"socket", "clone", "clone3"}

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K, _JGE_K, _JSET_K = 0x15, 0x35, 0x45
_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_AF_UNIX = 1
_CLONE_NEW_FLAGS = 0x7E020080  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
_X32_BIT = 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class SeccompFilter:
    """A compiled filter, ready to install with `install()` (children forked later inherit it)."""

    def __init__(self, program: list[tuple[int, int, int, int]], arch: str) -> None:
        self.arch = arch
        self.length = len(program)
        self._insns = (_SockFilter * len(program))(*[_SockFilter(*ins) for ins in program])
        self._prog = _SockFprog(len(program), self._insns)
        # Resolved once here, in the worker: looking `prctl` up in each forked child (ctypes'
        # attribute machinery, dlsym) cost CPU, and copy-on-write faults, on every call.
        self._prctl = ctypes.CDLL(None, use_errno=True).prctl
        self._prog_ref = ctypes.byref(self._prog)

    def install(self) -> None:
        """Set no_new_privs and install the filter on the calling thread; raise OSError on failure."""
        prctl = self._prctl
        if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS) failed: {errno.errorcode.get(err)}")
        if prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._prog_ref, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_SECCOMP) failed: {errno.errorcode.get(err)}")


def _assemble(
    items: list[tuple[int, str | int, str | int, int] | str],
) -> list[tuple[int, int, int, int]]:
    """Resolve label names in jump targets to the relative offsets BPF wants."""
    labels: dict[str, int] = {}
    insns: list[tuple[int, str | int, str | int, int]] = []
    for item in items:
        if isinstance(item, str):
            labels[item] = len(insns)
        else:
            insns.append(item)
    out = []
    for i, (code, jt, jf, k) in enumerate(insns):
        offs = []
        for target in (jt, jf):
            off = target if isinstance(target, int) else labels[target] - i - 1
            if not 0 <= off <= 255:
                raise ValueError(f"seccomp jump out of range at instruction {i}: {off}")
            offs.append(off)
        out.append((code, offs[0], offs[1], k))
    return out


def build_filter(arch: str | None = None) -> SeccompFilter | None:
    """Compile the sandbox filter for `arch` (default: this machine); None if the arch is unknown."""
    arch = arch or os.uname().machine
    if arch not in _NR:
        return None
    nr = _NR[arch]
    prog: list[tuple[int, str | int, str | int, int] | str] = [
        (_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (_JEQ_K, "arch_ok", "kill", _AUDIT_ARCH[arch]),
        "kill",
        (_RET_K, 0, 0, _RET_KILL_PROCESS),
        "arch_ok",
        (_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if arch == "x86_64":
        prog.append((_JGE_K, "eperm", 0, _X32_BIT))
    prog += [
        (_JEQ_K, "socket", 0, nr["socket"]),
        (_JEQ_K, "clone", 0, nr["clone"]),
        (_JEQ_K, "enosys", 0, nr["clone3"]),
    ]
    prog += [(_JEQ_K, "eperm", 0, n) for name, n in nr.items() if name not in _SPECIAL]
    prog += [
        (_RET_K, 0, 0, _RET_ALLOW),
        "socket",
        (_LD_W_ABS, 0, 0, 16),  # low 32 bits of args[0] (little endian): the address family
        (_JEQ_K, "allow", "eperm", _AF_UNIX),
        "clone",
        (_LD_W_ABS, 0, 0, 16),  # low 32 bits of args[0]: the clone flags
        (_JSET_K, "eperm", "allow", _CLONE_NEW_FLAGS),
        "allow",
        (_RET_K, 0, 0, _RET_ALLOW),
        "eperm",
        (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
        "enosys",
        (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
    ]
    return SeccompFilter(_assemble(prog), arch)


def denied_syscalls(arch: str | None = None) -> list[str]:
    """Names of the syscalls the filter refuses outright on `arch` (for the isolation report)."""
    return sorted(n for n in _NR.get(arch or os.uname().machine, {}) if n not in _SPECIAL)
