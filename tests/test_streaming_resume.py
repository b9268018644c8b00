"""kill -9 in the middle of a streaming run, then `--resume`: no finished group is lost or trained
twice (read from `RUN/stream_ledger.jsonl` and the checkpoint's stream state)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import read_metrics

from looprl.trainer.metrics import declared

pytestmark = pytest.mark.slow


def _ledger(run_dir: Path) -> list[tuple[int, int, int]]:
    """(step, position, rollout) of every trained episode."""
    path = run_dir / "stream_ledger.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["step"], r["position"], r["rollout"]) for r in rows]


def _train(config: Path, cwd: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "looprl", "train", str(config), *extra], cwd=cwd, env=env,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def test_kill_9_mid_stream_then_resume_loses_and_repeats_no_group(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(
        '[env]\nname = "looprl.testing.long_tail"\nkwargs = {every = 4, slow_s = 1.0}\n'
        '[model]\nname = "tiny"\n[rollout]\ntasks_per_step = 2\nrollouts_per_task = 2\n'
        "max_tokens = 8\n[trainer]\nsteps = 6\nsave_every = 2\neval_every = 0\n"
        "eval_tasks = 2\nstreaming = true\nmax_async_steps = 2\n"
        "[algorithm]\nupdates_per_batch = 4\n"  # groups pile up in the queue while it trains
        f'[run]\noutput_dir = "{tmp_path}"\nname = "r"\ntensorboard = false\n'
    )
    run_dir = tmp_path / "r"
    done = run_dir / "checkpoints" / "step_000002" / "COMPLETE"
    first = _train(config, tmp_path)
    end = time.monotonic() + 180
    while not done.is_file():
        assert first.poll() is None, first.stdout.read() if first.stdout else ""
        assert time.monotonic() < end, "no checkpoint at step 2 within 180 s"
        time.sleep(0.05)
    time.sleep(0.3)  # groups run on after the checkpoint
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    state = json.loads((run_dir / "checkpoints" / "step_000002" / "state.json").read_text())
    queued = {g["position"] for g in state["stream"]["queued"]}
    before = [row for row in _ledger(run_dir) if row[0] <= 2]
    assert queued and state["stream"]["restart"], "no group queued or in flight at the checkpoint"

    second = _train(config, tmp_path, "--resume", "--run-dir", str(run_dir))
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    rows = _ledger(run_dir)
    assert [row for row in rows if row[0] <= 2] == before  # the checkpoint's past is kept as is
    trained = [(position, rollout) for _, position, rollout in rows]
    assert len(trained) == len(set(trained))  # no episode trained twice
    after = {position for step, position, _ in rows if step > 2}
    assert not queued & {position for step, position, _ in rows if step <= 2}
    metrics = read_metrics(run_dir)
    assert [r["step"] for r in metrics] == [1, 2, 3, 4, 5, 6]
    # every group finished but untrained at the checkpoint is trained once after the resume,
    # or dropped and counted as staler than k (a straggler)
    dropped = sum(r["rollout/stale_dropped"] for r in metrics if r["step"] > 2)
    assert queued & after and 2 * len(queued - after) <= dropped, (state["stream"], rows)
    assert all(declared(key) for row in metrics for key in row)  # stream/ keys included
