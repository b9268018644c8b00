"""Smoke tests: each benchmark script runs end to end on a tiny budget (they measure; tests only run them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[1]


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_train_step_benchmark_quick():
    out = _run("benchmarks/train_step.py", "--quick")
    assert "s / step" in out and "tiny" in out


def test_engine_benchmark_quick():
    out = _run("-m", "benchmarks.engine", "--quick")
    assert "tok/s" in out or "tokens/s" in out


def test_sandbox_benchmark_quick():
    out = _run("-m", "benchmarks.sandbox", "--calls", "5", "--backends", "forkserver")
    assert "forkserver" in out
