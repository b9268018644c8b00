"""Ctrl-C, as a real SIGINT to a real `looprl` process: exit 130, one line saying what was kept
and how to resume, no traceback; the resume command it prints then finishes the job."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import LENGTH_ENV, read_metrics

from looprl.models.loading import resolve_model_path

pytestmark = pytest.mark.slow


def _default_sigint() -> None:
    """In the child: SIGINT acts, even when the suite was started in the background, where a
    shell without job control starts commands with SIGINT ignored (and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Looprl:
    """`python -m looprl ARGV` started in `cwd`, its stdout lines collected as they come."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        env.pop("LOOPRL_DEBUG", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "looprl", *argv], cwd=cwd, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigint,
        )  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        """Return once `ready()` holds; fail if the process ends first or `timeout` passes."""
        end = time.monotonic() + timeout
        while not ready():
            assert self.proc.poll() is None, f"ended early: {''.join(self.lines)}"
            assert time.monotonic() < end, f"not ready after {timeout}s: {''.join(self.lines)}"
            time.sleep(0.05)

    def interrupt(self) -> str:
        """Send SIGINT; expect exit 130 and one `interrupted: what — fix` line; that line."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.stderr is not None
        err = self.proc.stderr.read()
        assert self.proc.wait(timeout=60) == 130, err
        self._reader.join(timeout=10)
        lines = err.strip().splitlines()
        assert "Traceback" not in err and len(lines) == 1, err
        assert lines[0].startswith("interrupted: ") and " — " in lines[0], err
        return lines[0]


def _run_resume(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the `resume with: looprl ...` command an interruption printed."""
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[0] == "looprl"
    return subprocess.run(
        [sys.executable, "-m", "looprl", *command[1:]], cwd=cwd, capture_output=True, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=240,
    )  # fmt: skip


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def test_ctrl_c_in_eval_records_interrupted_and_the_printed_command_resumes(tmp_path):
    out = tmp_path / "ev"
    argv = ["eval", "calculator", "-m", "tiny", "-n", "12", "-r", "2", "--concurrency", "2"]
    argv += ["--max-tokens", "16", "--output", str(out)]
    run = Looprl(argv, tmp_path)
    run.wait_for(lambda: len(_lines(out / "results.jsonl")) >= 1)
    line = run.interrupt()
    meta = json.loads((out / "metadata.json").read_text())
    kept = len(_lines(out / "results.jsonl"))
    assert meta["status"] == "interrupted" and 0 < kept < 24
    assert f"{kept} episodes kept in {out / 'results.jsonl'}" in line
    assert line.endswith(f"resume with: looprl {shlex.join(argv)} --resume")
    done = _run_resume(line, tmp_path)
    assert done.returncode == 0, done.stderr
    ids = [
        (r["task"]["id"], r["rollout_index"])
        for r in map(json.loads, _lines(out / "results.jsonl"))
    ]
    assert len(ids) == len(set(ids)) == 24  # the kept episodes and the rest, none twice
    assert json.loads((out / "metadata.json").read_text())["status"] == "finished"


def test_ctrl_c_in_train_resumes_from_the_last_checkpoint(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(
        f'[env]\nname = "{LENGTH_ENV}"\n[model]\nname = "tiny"\n'
        "[rollout]\ntasks_per_step = 2\nrollouts_per_task = 2\n"
        "[trainer]\nsteps = 3\nsave_every = 1\neval_every = 0\neval_before = false\n"
        f'[run]\noutput_dir = "{tmp_path}"\nname = "r"\ntensorboard = false\n'
    )
    run_dir = tmp_path / "r"
    run = Looprl(["train", str(config)], tmp_path)
    run.wait_for(lambda: (run_dir / "checkpoints" / "step_000001" / "COMPLETE").is_file())
    line = run.interrupt()
    assert f"the run {run_dir} stopped; its last checkpoint is step_00000" in line
    assert line.endswith(f"resume with: looprl train {config} --resume --run-dir {run_dir}")
    assert not (run_dir / "final").exists()
    done = _run_resume(line, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "resumed from" in done.stdout
    assert [row["step"] for row in read_metrics(run_dir)] == [1, 2, 3]  # none lost or twice
    assert (run_dir / "final" / "config.json").is_file()


def test_ctrl_c_in_sft_leaves_the_model_it_would_overwrite_whole(tmp_path):
    data = tmp_path / "d.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"{i} + 1?"},
                      {"role": "assistant", "content": f"The answer is {i + 1}."}]}
        for i in range(8)
    ]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "model"
    shutil.copytree(resolve_model_path("tiny"), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    argv = ["sft", "--data", str(data), "-m", "tiny", "--output", str(out), "--overwrite"]
    run = Looprl([*argv, "--epochs", "500", "--batch-size", "4"], tmp_path)
    run.wait_for(lambda: any(line.startswith("step ") for line in run.lines))
    line = run.interrupt()
    kept = f"interrupted: fine-tuning stopped; {out} was left as it was — rerun the command"
    assert line == kept
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "model"]  # no .tmp-*
