"""`looprl bootstrap` sampling on vLLM: a server started on each round's model, and stopped after it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from looprl.cli.main import main

pytestmark = [pytest.mark.slow, pytest.mark.vllm]  # skipped without the venv: conftest.py


def _vllm_children() -> list[str]:
    """Command lines of this process's children that run vLLM."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if ppid == os.getpid() and "vllm" in cmdline:
            found.append(cmdline)
    return found


def test_each_round_samples_its_own_model_on_vllm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # success_threshold 0: every scored attempt is kept, so round 1 fine-tunes the tiny model and
    # round 2 samples that model (a new server on round_1/model), stalls and hands over
    out = tmp_path / "boot"
    argv = ["bootstrap", "calculator", "-m", "tiny", "--output", str(out), "--engine.kind", "vllm",
            "--env.kwargs.digits", "1", "--env.kwargs.max_tokens_per_turn", "8",
            "--bootstrap.tasks", "3", "--bootstrap.attempts", "2", "--bootstrap.max_rounds", "2",
            "--bootstrap.success_threshold", "0", "--bootstrap.sft_lr", "1e-3"]  # fmt: skip
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "bootstrap.jsonl").read_text().splitlines()]
    assert [r["stop"] for r in rows] == [None, "stalled"]
    assert rows[0]["kept"] == rows[0]["attempts"] == 6 and rows[0]["tokens"] > 0
    assert rows[1]["sampled_model"] == str(out / "round_1" / "model") and rows[1]["tokens"] > 0
    assert "model handed over" in capsys.readouterr().out
    assert _vllm_children() == []  # each round's server was stopped with its round
