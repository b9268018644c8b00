"""A run directory trains once: a live trainer's lock refuses a second with one line, the kernel
frees it when the holder dies; a bad `--engine.base_urls` is one line and no run directory; the
launcher's filter leaves a rank's one-line error without torchrun's report (`looprl.cli.torchrun`)."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from looprl.cli.main import main
from looprl.cli.torchrun import StderrFilter
from looprl.trainer.run_lock import LOCK_NAME, RunInUse, RunLock, check_run_free
from looprl.trainer.trainer import Trainer
from tests.helpers import LENGTH_ENV, small_config

ARGS = ["--model.name", "tiny", "--env.name", LENGTH_ENV, "--trainer.steps", "1",
        "--run.tensorboard", "false"]  # fmt: skip


def _snapshot(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `run_dir`: its bytes and modification time (ns)."""
    return {
        str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def _a_run(run_dir: Path) -> None:
    """Files of a run in progress, for a resume to find."""
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.json").write_text("{}\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')


def test_a_held_run_refuses_a_resume_with_one_line_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _a_run(run_dir)
    lock = RunLock(run_dir)
    before = _snapshot(run_dir)
    try:
        assert main(["train", "--resume", "--run-dir", str(run_dir), *ARGS]) == 2
    finally:
        lock.release()
    err = capsys.readouterr().err.strip().splitlines()
    pid = os.getpid()
    assert err == [
        f"error: {run_dir} is in use by a training run (PID {pid}) — stop it (kill {pid}) or "
        "wait; --run-dir another directory to start anew"
    ]
    assert _snapshot(run_dir) == before
    check_run_free(run_dir)  # released: free again


@pytest.mark.slow  # builds the policy before it opens the run: ~6 s on 2 busy cores
def test_a_trainer_that_loses_the_race_for_the_lock_writes_nothing(tmp_path):
    """The check at construction passed; another trainer took the directory before this one
    opened it: refused when it opens the run, with no config.json or summary.json written."""
    cfg = small_config(tmp_path, "raced")
    run_dir = tmp_path / "raced"
    trainer = Trainer(cfg, run_dir=run_dir)
    run_dir.mkdir()
    lock = RunLock(run_dir)
    try:
        with pytest.raises(RunInUse, match=f"PID {os.getpid()}"):
            trainer.run()
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME]
    finally:
        lock.release()


HOLD = (
    "import sys, time; from pathlib import Path; from looprl.trainer.run_lock import RunLock; "
    "RunLock(Path(sys.argv[1])); print('held', flush=True); time.sleep(120)"
)


def test_the_lock_dies_with_its_holder(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunInUse, match=f"PID {holder.pid}"):
            check_run_free(run_dir)
        with pytest.raises(RunInUse):
            RunLock(run_dir)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    check_run_free(run_dir)  # the kernel dropped it with the process: no stale lock
    RunLock(run_dir).release()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("kind", ["notaurl", "closed port"])
def test_a_bad_base_url_is_one_line_and_no_run_directory(tmp_path, capsys, kind):
    url = "notaurl" if kind == "notaurl" else f"http://127.0.0.1:{_closed_port()}/v1"
    run_dir = tmp_path / "run"
    argv = ["train", "--run-dir", str(run_dir), *ARGS, "--engine.kind", "vllm",
            "--engine.base_urls", url]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --engine.base_urls {url!r}: ")
    fix = "http://HOST:PORT/v1" if kind == "notaurl" else "start the vLLM server there"
    assert fix in err[0]
    assert not run_dir.exists()


# torchrun's stderr when both ranks refused a setting only a rank checks (torch 2.13)
RANK_ERROR = b"error: not yet supported with several processes: trainer.max_async_steps > 0\n"
REPORT = b"""\
W1203 16:57:09.155000 19134 torch/distributed/elastic/multiprocessing/api.py:1028] Sending \
process 19139 closing signal SIGTERM
E1203 16:29:19.592000 29124 torch/distributed/elastic/multiprocessing/api.py:1002] failed \
(exitcode: 2) local_rank: 0 (pid: 29143) of binary: /work/main/.venv/bin/python
Traceback (most recent call last):
  File "/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
looprl FAILED
------------------------------------------------------------
  exitcode  : 2 (pid: 29143)
============================================================
"""


def _filtered(*chunks: bytes) -> bytes:
    out = io.BytesIO()
    stderr_filter = StderrFilter(out)
    for chunk in chunks:
        for line in chunk.splitlines(keepends=True):
            stderr_filter.feed(line)
    stderr_filter.finish()
    return out.getvalue()


def test_a_ranks_one_line_error_is_all_that_is_left():
    warning = b"W1203 torch/distributed/run.py:800] some warning\n"
    assert _filtered(warning, RANK_ERROR, RANK_ERROR, REPORT) == warning + RANK_ERROR


def test_a_rank_that_crashed_keeps_torchruns_report():
    crash = b"Traceback (most recent call last):\nZeroDivisionError: division by zero\n"
    assert _filtered(crash, REPORT) == crash + REPORT


def test_torchruns_report_of_a_signal_the_launcher_passed_on_is_left_out():
    signal_report = (
        b"W1203 16:53:25.339000 18331 torch/distributed/elastic/agent/server/api.py:753] "
        b"Received 15 death signal, shutting down workers\n"
        b"Traceback (most recent call last):\n"
        b"torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 15\n"
    )
    step = b"step 4/1000 | reward 0.47\n"
    out = io.BytesIO()
    stderr_filter = StderrFilter(out)
    for line in (step + signal_report).splitlines(keepends=True):
        stderr_filter.feed(line)
    stderr_filter.finish(signalled=True)
    assert out.getvalue() == step
