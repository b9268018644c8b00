"""`looprl train --nproc N`: torchrun as a child that lives and dies with the launcher.

1. The launcher starts torchrun with a parent-death signal (SIGTERM, `die_with_parent` in
   `looprl.engines.vllm_shim`) in a process group of its own, and forwards SIGINT and SIGTERM to
   it: Ctrl-C, `kill` and `kill -9` of `looprl` all stop the job (torchrun's agent then stops
   its ranks); the launcher exits 128 + the signal.
2. Each rank asks for SIGKILL when torchrun's agent dies (`stay_with_launcher`), so kill -9 of
   the agent leaves no rank training. The race (the agent died before the request) is closed by
   checking, after it, that the rank's parent is still the launcher's child.
3. torchrun's stderr passes through the launcher: a rank's one-line `error:` or `interrupted`
   (each printed once, though every rank may print it) is what the user reads, and torchrun's
   report of that failure or of the signal the launcher passed on (a `ChildFailedError` or
   `SignalException` traceback, ~40 lines) is left out. A rank that failed any other way (a
   bug, a signal from elsewhere) keeps torchrun's whole report.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from looprl.engines.vllm_shim import die_with_parent
from looprl.trainer.run_lock import RUN_STAMP_ENV, run_stamp

LAUNCHER_ENV = "LOOPRL_LAUNCHER_PID"
"""The launcher's PID, in torchrun's environment and so in every rank's."""
ONE_LINERS = (b"error: ", b"interrupted")
"""How `looprl.cli.main` starts the one line it prints for a user's mistake or Ctrl-C."""
REPORT_STARTS = (b"failed (exitcode:", b"closing signal", b"death signal, shutting down")
"""What torchrun's first log line on a failed rank (it stops the others) or a signal holds."""


class StderrFilter:
    """Copies torchrun's stderr line by line, leaving out its report on a rank's one-line error."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.one_liners: list[bytes] = []  # the `error:`/`interrupted` lines seen, once each
        self.report: list[bytes] = []  # torchrun's lines from REPORT_START on, held back

    def feed(self, line: bytes) -> None:
        """Pass `line` on, hold it back as part of torchrun's report, or drop a repeated one-liner."""
        if line.startswith(ONE_LINERS):
            if line not in self.one_liners:
                self.one_liners.append(line)
                self._write(line)
        elif self.report or (b"torch" in line and any(s in line for s in REPORT_STARTS)):
            self.report.append(line)
        else:
            self._write(line)

    def finish(self, signalled: bool = False) -> None:
        """At the end: torchrun's report, unless a rank's one line already said what failed or
        the launcher passed on a signal (`signalled`: the user stopped the job)."""
        if not self.one_liners and not signalled:
            for line in self.report:
                self._write(line)
        self.report = []

    def _write(self, line: bytes) -> None:
        self.out.write(line)
        self.out.flush()


def launch(cmd: list[str]) -> int:
    """Run torchrun's `cmd` tied to this process (module doc); returns the job's exit code."""
    parent = os.getpid()

    def tie_to_launcher() -> None:  # in the child, before exec
        if not die_with_parent(signal.SIGTERM, parent):
            os._exit(1)  # the launcher is already gone

    job = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, env=_job_env(parent),
        preexec_fn=tie_to_launcher, start_new_session=True,  # Ctrl-C reaches it once: forwarded
    )  # fmt: skip
    stderr_filter = StderrFilter(sys.stderr.buffer)
    assert job.stderr is not None
    reader = threading.Thread(target=_copy, args=(job.stderr, stderr_filter), daemon=True)
    reader.start()
    got: list[int] = []
    code = _wait_forwarding(job, got)
    reader.join(timeout=5.0)  # a grandchild may hold the pipe open: do not wait on it for long
    stderr_filter.finish(signalled=bool(got))
    if got:
        return 128 + got[0]
    if code < 0:  # torchrun itself was killed: its ranks went with it (they ask for SIGKILL)
        print(f"error: torchrun was killed (signal {-code}); the job stopped — resume it with "
              "--resume", file=sys.stderr)  # fmt: skip
        return 128 - code
    if code and stderr_filter.one_liners:  # what `looprl.cli.main` returns for that line
        return 130 if stderr_filter.one_liners[0].startswith(b"interrupted") else 2
    return code


def _job_env(launcher: int) -> dict[str, str]:
    """torchrun's environment: the launcher's PID, and one run-name stamp for every rank."""
    return {RUN_STAMP_ENV: run_stamp(), **os.environ, LAUNCHER_ENV: str(launcher)}


def _copy(pipe: IO[bytes], stderr_filter: StderrFilter) -> None:
    for line in iter(pipe.readline, b""):
        stderr_filter.feed(line)


def _wait_forwarding(job: subprocess.Popen[bytes], got: list[int]) -> int:
    """Wait for `job`, passing SIGINT and SIGTERM on to it (their numbers appended to `got`)."""

    def forward(signum: int, frame: Any) -> None:
        got.append(signum)
        job.send_signal(signum)

    saved = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return job.wait()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def stay_with_launcher() -> None:
    """In a rank under torchrun: SIGKILL when torchrun's agent dies; exit now if it already has.

    With `looprl train --nproc N` the agent's own parent must be the launcher; under a plain
    torchrun, a rank whose parent is PID 1 was orphaned before it asked.
    """
    parent = os.getppid()
    launcher = os.environ.get(LAUNCHER_ENV)
    alive = die_with_parent(signal.SIGKILL, parent) and parent != 1
    if alive and launcher:
        alive = _parent_of(parent) == int(launcher)
    if not alive:
        raise SystemExit("error: torchrun stopped before this rank started; the job is over")


def _parent_of(pid: int) -> int | None:
    """The parent PID of `pid` from /proc (None when the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat.rsplit(b")", 1)[1].split()[1])
