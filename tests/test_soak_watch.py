"""The long soak's pure parts: /proc readers, run counters, windows, and the faulty environment."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from benchmarks.soak_env import HUGE_CHARS, fault_of, is_huge, load_environment
from benchmarks.soak_watch import (
    Proc,
    RunCounters,
    Sample,
    format_table,
    read_proc,
    total_row,
    windows,
)
from looprl.envs.base import ToolEnv
from looprl.envs.calculator import calculate
from looprl.tools.executor import ToolResult
from looprl.types import EpisodeResult, Message, Task, ToolCall, ToolOutcome

# -- /proc ------------------------------------------------------------------------------------


def test_read_proc_sees_this_process_open_a_file_and_start_a_thread(tmp_path: Path) -> None:
    before = read_proc(os.getpid())
    assert before is not None and before.rss_mb > 1 and before.threads >= 1
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    with (tmp_path / "f").open("w"):
        worker.start()
        during = read_proc(os.getpid())
        stop.set()
        worker.join()
    assert during is not None
    assert during.fds == before.fds + 1
    assert during.threads == before.threads + 1


def test_read_proc_of_an_exited_process_or_a_zombie_is_none(tmp_path: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert read_proc(proc.pid) is None
    zombie = tmp_path / "7"  # a zombie keeps its status file, without VmRSS
    (zombie / "fd").mkdir(parents=True)
    (zombie / "status").write_text("Name:\tpython\nState:\tZ (zombie)\nThreads:\t1\n")
    assert read_proc(7, proc_root=tmp_path) is None
    (zombie / "status").write_text("Name:\tpython\nVmRSS:\t  2048 kB\nThreads:\t12\n")
    (zombie / "fd" / "0").touch()
    assert read_proc(7, proc_root=tmp_path) == Proc(rss_mb=2.0, fds=1, threads=12)


# -- counters from a run directory ------------------------------------------------------------


def _episode(*outcomes: ToolOutcome) -> str:
    task = Task(id="t", prompt=[Message(role="user", content="What is 1+1?")])
    ep = EpisodeResult(task=task, tool_outcomes=list(outcomes))
    return ep.to_json() + "\n"


def test_run_counters_count_steps_and_tool_calls_and_see_a_rewritten_file(tmp_path: Path) -> None:
    ok, raised = ToolOutcome("calculate"), ToolOutcome("calculate", error_kind="exception")
    hung = ToolOutcome("calculate", error_kind="timeout", infra=True)
    refused = ToolOutcome("calculate", error_kind="unavailable", infra=True)
    bad = ToolOutcome("calculate", error_kind="malformed_json")  # the tool never ran
    (tmp_path / "rollouts").mkdir()
    rows = [{"step": 1, "train/grad_norm": 0.0}, {"step": 2, "train/grad_norm": 0.3}]
    rows.append({"step": 2, "train/grad_norm": 0.3})  # logged again after a resume
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "lo'  # a torn last line
    (tmp_path / "metrics.jsonl").write_text(text)
    (tmp_path / "rollouts" / "step_000001.jsonl").write_text(_episode(ok, hung) + _episode())
    (tmp_path / "rollouts" / "step_000002.jsonl").write_text(_episode(raised, refused, ok, bad))
    counters = RunCounters(tmp_path)
    # 3 episodes, 1 invalid call, 5 valid: 3 answered (two ran, one raised), 1 timed out, 1 refused
    want = {
        "steps": 2,
        "updates": 1,
        "episodes": 3,
        "invalid": 1,
        "calls": 5,
        "answered": 3,
        "timeouts": 1,
    }
    want["unavailable"] = 1
    assert counters.read() == want
    (tmp_path / "rollouts" / "step_000002.jsonl").write_text(_episode(ok))  # rewritten on resume
    assert counters.read() == {**want, "invalid": 0, "calls": 3, "answered": 2, "unavailable": 0}


# -- windows ----------------------------------------------------------------------------------


def _sample(t: float, steps: int, calls: int, answered: int, rss: float | None) -> Sample:
    proc = None if rss is None else Proc(rss_mb=rss, fds=int(rss // 10), threads=int(rss // 100))
    return Sample(t=t, steps=steps, episodes=16 * steps, calls=calls, answered=answered, proc=proc)


def test_windows_give_each_window_its_gains_and_the_process_at_its_end() -> None:
    samples = [
        _sample(30, 1, 10, 10, 500),
        _sample(60, 3, 30, 29, 700),  # t=60 closes the first minute
        _sample(90, 4, 40, 38, 900),
        _sample(120, 5, 50, 40, None),  # the trainer was between runs
        # no sample in minute 3
        _sample(200, 9, 90, 40, 800),  # the last, shorter window
    ]
    samples[-1].restarts = 1
    rows = windows(samples, 60)
    assert [r["window"] for r in rows] == [1, 2, 4]
    first, second, last = rows
    assert (first["steps"], first["episodes"], first["calls"], first["answered"]) == (3, 48, 30, 29)
    assert first["answered_pct"] == pytest.approx(96.7)
    assert (first["rss_mb"], first["rss_mb_max"], first["fds"], first["threads"]) == (
        700,
        700,
        70,
        7,
    )
    # minute 2: gains from the t=60 sample; its last sample had no process: the last live one
    assert (second["steps"], second["calls"], second["answered"]) == (2, 20, 11)
    assert (second["rss_mb"], second["rss_mb_max"], second["restarts"]) == (900, 900, 0)
    assert (last["minutes"], last["steps"], last["calls"], last["answered"]) == (3.3, 4, 40, 0)
    assert (last["answered_pct"], last["restarts"]) == (0.0, 1)
    whole = total_row(samples)
    assert (whole["window"], whole["steps"], whole["calls"], whole["answered"]) == (
        "all",
        9,
        90,
        40,
    )
    assert (whole["rss_mb"], whole["rss_mb_max"]) == (800, 900)


def test_a_window_with_no_call_or_no_process_shows_a_dash() -> None:
    rows = windows([_sample(10, 0, 0, 0, None)], 60)
    assert rows[0]["answered_pct"] is None and rows[0]["rss_mb"] is None
    lines = format_table(rows).splitlines()
    assert lines[0].split()[:3] == ["win", "min", "steps"]
    assert lines[1].split() == ["1", "0.2"] + ["0"] * 6 + ["-", "0", "0", "-", "-", "-", "0"]


# -- the faulty environment -------------------------------------------------------------------


def test_faults_come_at_their_rates_and_never_together() -> None:
    texts = [f"{a}*{b}+7" for a in range(100) for b in range(100)]
    faults = [fault_of(t, 0.05, 0.10, 0.15) for t in texts]
    for fault, rate in (("hang", 0.05), ("raise", 0.10), ("malformed", 0.15)):
        assert faults.count(fault) / len(texts) == pytest.approx(rate, abs=0.01)
    assert {fault_of(t, 0.0, 0.0, 0.0) for t in texts} == {"none"}
    assert "none" not in {fault_of(t, 0.5, 0.25, 0.25) for t in texts}
    with pytest.raises(ValueError, match="sum to at most 1"):
        load_environment(hang_rate=0.5, raise_rate=0.5, malformed_rate=0.5)


def _answers(env: ToolEnv, expressions: list[str]) -> list[ToolResult]:
    calls = [
        ToolCall(id=str(i), name="calculate", arguments={"expression": e})
        for i, e in enumerate(expressions)
    ]
    return asyncio.run(env.executor.run(calls, {}))


def test_the_soak_tool_hangs_raises_and_answers_malformed_output() -> None:
    by_fault: dict[str, str] = {}
    for a in range(200):
        by_fault.setdefault(fault_of(f"{a}+1", 0.2, 0.2, 0.4), f"{a}+1")
    env = load_environment(hang_rate=0.2, raise_rate=0.2, malformed_rate=0.4, tool_timeout=0.2)
    try:
        results = dict(zip(by_fault, _answers(env, list(by_fault.values())), strict=True))
    finally:
        env.close()
    assert set(results) == {"none", "hang", "raise", "malformed"}
    assert results["hang"].error_kind == "timeout" and results["hang"].infra
    assert results["raise"].error_kind == "exception"
    assert "injected tool failure" in results["raise"].content
    assert results["none"].error_kind is None
    assert results["none"].content == str(calculate(by_fault["none"]))
    assert results["malformed"].error_kind is None
    assert results["malformed"].content.startswith(f"{calculate(by_fault['malformed'])} \ufffd NaN")


def test_one_in_huge_every_malformed_answers_is_huge_and_cut() -> None:
    expressions = [f"{a}-3" for a in range(30)]
    env = load_environment(hang_rate=0.0, raise_rate=0.0, malformed_rate=1.0, huge_every=3)
    try:
        results = _answers(env, expressions)
    finally:
        env.close()
    huge = [is_huge(e, 3) for e in expressions]
    assert 3 <= sum(huge) <= 20
    assert [r.truncated for r in results] == huge
    assert all(len(r.content) < 5000 < HUGE_CHARS for r in results)
