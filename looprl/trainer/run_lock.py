"""One trainer per run directory: an exclusive `flock` on `RUN/trainer.lock`, held for the run.

The trainer (rank 0 under torchrun, else the only process) takes the lock when it opens the run
directory, before it restores or writes anything, and writes its PID into the file. The kernel
drops the lock when that process ends, however it ends (kill -9 included), so a stale file never
blocks a resume. A second trainer, or `looprl train --nproc N` before it starts torchrun, only
tests the lock (`check_run_free`): it writes nothing and refuses with one line naming the PID.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from looprl.trainer.config import ConfigError

LOCK_NAME = "trainer.lock"
RUN_STAMP_ENV = "LOOPRL_RUN_STAMP"
"""Set by the `--nproc` launcher: the time stamp every rank puts in a default run name."""


def run_stamp() -> str:
    """The time stamp of a run named by default (`ENV-PRESET-STAMP`): the launcher's under
    torchrun, so that every rank opens the same run directory; else now."""
    return os.environ.get(RUN_STAMP_ENV) or time.strftime("%Y%m%d-%H%M%S")


class RunInUse(ConfigError):
    """Another live process trains in this run directory."""

    def __init__(self, run_dir: Path, pid: int | None) -> None:
        who = f"PID {pid}" if pid else "another process"
        stop = f"kill {pid}" if pid else f"the process holding {run_dir / LOCK_NAME}"
        super().__init__(
            f"{run_dir} is in use by a training run ({who}); stop it ({stop}) or wait; "
            "--run-dir another directory to start anew"
        )


def _holder(fd: int) -> int | None:
    """The PID written in the lock file (None while the holder has not written it yet)."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def check_run_free(run_dir: Path) -> None:
    """Raise `RunInUse` when a live trainer holds `run_dir`; read-only (creates nothing)."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise RunInUse(run_dir, _holder(fd)) from None
    finally:
        os.close(fd)  # closing drops a lock this test took


def _try_exclusive(fd: int, tries: int = 5) -> bool:
    """Take the exclusive lock; a few short retries ride out a `check_run_free` testing it."""
    for attempt in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < tries:
                time.sleep(0.02)
    return False


class RunLock:
    """The held lock of one run directory; `release()` (or process death) frees it."""

    def __init__(self, run_dir: Path) -> None:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        if not _try_exclusive(fd):
            pid = _holder(fd)
            os.close(fd)
            raise RunInUse(run_dir, pid)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd: int | None = fd

    def release(self) -> None:
        """Free the lock (idempotent)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
