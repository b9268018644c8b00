"""`looprl train --nproc 2` runs once: killing the launcher (SIGTERM or kill -9) or torchrun's
agent (kill -9) leaves no process training, a second launch into a live run is refused with one
line and writes nothing, and a rank's one-line error is all the user reads (`looprl.cli.torchrun`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from looprl.trainer.run_lock import RunInUse, check_run_free
from tests.helpers import LENGTH_ENV

pytestmark = pytest.mark.slow

ARGS = [
    "--model.name", "tiny", "--env.name", LENGTH_ENV,
    "--rollout.tasks_per_step", "2", "--rollout.rollouts_per_task", "2",
    "--trainer.steps", "1000", "--trainer.eval_every", "0", "--trainer.save_every", "1",
    "--trainer.save_rollouts", "0", "--run.tensorboard", "false",
]  # fmt: skip
GONE_WITHIN_S = 20.0  # measured: ~1-3 s on 2 busy cores; torchrun's own grace period is 30 s


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _children(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_bytes()
        except OSError:
            continue
        fields = text.rsplit(b")", 1)[1].split()
        if fields[0] != b"Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        found += kids
        frontier = kids
    return found


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return text.rsplit(b")", 1)[1].split()[0] != b"Z"


def _start(run_dir: Path, *extra: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    """Launch `looprl train --nproc 2` and wait until rank 0 holds the run directory; returns
    the launcher and its descendants (torchrun and the two ranks)."""
    cmd = [sys.executable, "-m", "looprl", "train", "--nproc", "2", "--run-dir", str(run_dir)]
    log = (run_dir.parent / f"{run_dir.name}.log").open("ab")
    launcher = subprocess.Popen([*cmd, *ARGS, *extra], stdout=log, stderr=log, env=_env())
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert launcher.poll() is None, (run_dir.parent / f"{run_dir.name}.log").read_text()
        try:
            check_run_free(run_dir)
        except RunInUse:
            family = _children(launcher.pid)
            assert len(family) >= 3, family  # torchrun and two ranks
            return launcher, family
        time.sleep(0.5)
    launcher.kill()
    raise AssertionError("rank 0 never took the run directory")


def _wait_gone(pids: list[int]) -> float:
    """Seconds until none of `pids` is alive (fails past GONE_WITHIN_S)."""
    start = time.monotonic()
    while any(_alive(p) for p in pids):
        if time.monotonic() - start > GONE_WITHIN_S:
            left = [p for p in pids if _alive(p)]
            for p in left:
                os.kill(p, signal.SIGKILL)
            raise AssertionError(f"still running {GONE_WITHIN_S} s later: {left}")
        time.sleep(0.1)
    return time.monotonic() - start


def _snapshot(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def test_a_live_job_refuses_a_second_and_stops_with_its_launcher(tmp_path):
    """SIGTERM to the launcher stops torchrun and both ranks; while the job ran, `--resume` into
    its directory was refused with one line, and then (the job gone) the directory was free."""
    run_dir = tmp_path / "run"
    launcher, family = _start(run_dir)
    for pid in family:  # hold the job still, so that any write by the refused launch would show
        os.kill(pid, signal.SIGSTOP)
    try:
        # a write under way when the stop came still lands: wait until the files hold still
        before = _snapshot(run_dir)
        for _ in range(50):
            time.sleep(0.1)
            if (settled := _snapshot(run_dir)) == before:
                break
            before = settled
        again = subprocess.run(
            [sys.executable, "-m", "looprl", "train", "--nproc", "2", "--resume", "--run-dir",
             str(run_dir), *ARGS],
            capture_output=True, text=True, env=_env(), timeout=120,
        )  # fmt: skip
        assert _snapshot(run_dir) == before
    finally:
        for pid in family:
            os.kill(pid, signal.SIGCONT)
    assert again.returncode == 2
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1, again.stderr
    assert lines[0].startswith(f"error: {run_dir} is in use by a training run (PID ")
    assert "stop it (kill " in lines[0] and "--run-dir another directory" in lines[0]
    holder = int(lines[0].split("(PID ")[1].split(")")[0])
    assert holder in family  # rank 0

    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=GONE_WITHIN_S) == 128 + signal.SIGTERM
    print(f"SIGTERM: every process gone after {_wait_gone(family):.1f} s")
    check_run_free(run_dir)
    log = (tmp_path / "run.log").read_text()
    assert "Traceback" not in log and "SignalException" not in log  # torchrun's report held back


def test_kill_9_of_the_launcher_or_of_torchrun_leaves_no_rank(tmp_path):
    run_dir = tmp_path / "run"
    launcher, family = _start(run_dir)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    print(f"kill -9 launcher: every process gone after {_wait_gone(family):.1f} s")

    launcher, family = _start(run_dir, "--resume")  # the lock went with the dead rank 0
    torchrun = min(family)  # the launcher's child, started before the ranks
    assert Path(f"/proc/{torchrun}/cmdline").read_bytes().count(b"torch.distributed.run") == 1
    os.kill(torchrun, signal.SIGKILL)
    print(f"kill -9 torchrun: every process gone after {_wait_gone(family):.1f} s")
    assert launcher.wait(timeout=GONE_WITHIN_S) == 128 + signal.SIGKILL


def test_a_rank_only_error_is_one_line(tmp_path):
    """A setting only a rank checks (the environment, loaded by `Trainer` in each rank): its one
    line, exit 2, without torchrun's ChildFailedError report."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "looprl", "train", "--nproc", "2", "--run-dir", str(run_dir),
           *ARGS, "--env.name", "no_such_env"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: env.name: unknown environment 'no_such_env' — use one of")
    assert not run_dir.exists()
