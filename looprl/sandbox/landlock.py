"""Landlock (Linux >= 5.13) through raw syscalls with ctypes: restrict a process's file and TCP access.

A Landlock ruleset lists the kinds of access it *handles*; anything handled and not granted by a
rule is denied to the process that calls `landlock_restrict_self` and to all its descendants,
whatever the file permissions say, even for root. The sandbox grants read access to the Python
installation and system libraries, full access to the scratch directory, write access to
`/dev/null`, and nothing else. With ABI >= 4 TCP bind/connect is handled with no rule (so denied);
with ABI >= 6 the process is also scoped: it cannot signal processes outside its own domain
(the fork server, the trainer, other sandboxes) nor reach their abstract unix sockets.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

_SYS_CREATE_RULESET = 444  # same number on x86_64 and aarch64 (unified syscall table)
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

READ = READ_FILE | READ_DIR
FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # rights a file rule may carry
_ARCHES = {"x86_64", "aarch64"}


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def abi_version() -> int:
    """The Landlock ABI the kernel offers (0 when Landlock is missing or disabled)."""
    if os.uname().machine not in _ARCHES:
        return 0
    ret = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return int(ret) if ret > 0 else 0


def handled_fs(abi: int) -> int:
    """Every filesystem access right the given ABI knows (all of them are handled, so denied by default)."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


class Ruleset:
    """A Landlock policy for one sandbox child: read-only paths, read-write paths, TCP, scoping."""

    def __init__(self, abi: int) -> None:
        if abi < 1:
            raise OSError("Landlock is not available on this kernel (ABI 0)")
        self.abi = abi
        self.fs = handled_fs(abi)
        attr = _RulesetAttr(
            self.fs,
            NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
            SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0,
        )
        fd = _syscall(
            _SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0
        )
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_create_ruleset failed: {os.strerror(err)}")
        self.fd = int(fd)

    def allow(self, path: str, access: int) -> bool:
        """Grant `access` beneath `path` (a file gets only file rights); False if the path is missing."""
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            access &= self.fs
            if not os.path.isdir(path):
                access &= FILE_ONLY
            attr = _PathBeneathAttr(access, pfd)
            if _syscall(_SYS_ADD_RULE, self.fd, _RULE_PATH_BENEATH, ctypes.byref(attr), 0) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"landlock_add_rule({path!r}) failed: {os.strerror(err)}")
        finally:
            os.close(pfd)
        return True


def restrict_with(fd: int) -> None:
    """Enforce a ruleset on the calling process (needs no_new_privs or CAP_SYS_ADMIN), close `fd`."""
    try:
        if _syscall(_SYS_RESTRICT_SELF, fd, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self failed: {os.strerror(err)}")
    finally:
        os.close(fd)


def build(read_only: Iterable[str], read_write: Iterable[str], abi: int) -> int:
    """A ruleset fd: `read_only` paths readable, `read_write` paths fully usable, no execution.

    The fd can be inherited by forked children, each enforcing it with `restrict_with`.
    """
    rules = Ruleset(abi)
    for path in read_only:
        rules.allow(path, READ)
    for path in read_write:
        rules.allow(path, rules.fs & ~EXECUTE)
    return rules.fd


def apply(read_only: Iterable[str], read_write: Iterable[str], abi: int) -> None:
    """Build a ruleset (see `build`) and enforce it on the calling process."""
    restrict_with(build(read_only, read_write, abi))
