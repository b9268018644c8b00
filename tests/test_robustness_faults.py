"""Faults that are not the model's: hung tools, dead servers, prompts with no room to generate.

A hung tool is an infrastructure fault, the pool recovers, and `looprl eval` exits promptly;
`--resume` re-runs groups that hold infrastructure errors; a run that mostly errored says so and
exits non-zero; an episode that could not generate a token is not scored.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import add
from helpers import tool_call as call

from looprl.cli.main import main
from looprl.engines.scripted import ScriptedEngine
from looprl.envs.base import Limits
from looprl.envs.calculator import load_environment
from looprl.eval.summary import error_headline, summarize
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import run_group
from looprl.testing.fake_openai import FakeOpenAIServer, FakeReply
from looprl.tools import MALFORMED_JSON, TIMEOUT, ToolExecutor, ToolsHung
from looprl.tools.threads import ToolThreads

HANG_ENV = str(Path(__file__).parent / "envs" / "hang_env.py")
RELEASE = threading.Event()


def stuck(seconds: float) -> str:
    """Block until the test releases it.

    Args:
        seconds: ignored.
    """
    RELEASE.wait()
    return "released"


async def test_hung_sync_calls_do_not_starve_other_tools() -> None:
    """40 hung calls on a 4-thread pool: each is a timeout marked infra, `add` still answers."""
    RELEASE.clear()
    ex = ToolExecutor([stuck, add], timeout=0.2, max_threads=4)
    try:
        hung = await ex.run([call("stuck", i, seconds=1) for i in range(40)], {})
        assert {(r.error_kind, r.infra) for r in hung} == {(TIMEOUT, True)}
        assert ex.hung_calls == 40
        t0 = time.perf_counter()
        quick = await ex.run([call("add", i, a=i, b=1) for i in range(8)], {})
        assert [r.content for r in quick] == [str(i + 1) for i in range(8)]
        assert not any(r.infra or r.error_kind for r in quick)
        assert time.perf_counter() - t0 < 0.2 * 4  # none waited out a timeout for a thread
    finally:
        RELEASE.set()
        ex.close()
    deadline = time.monotonic() + 5
    while ex.hung_calls and time.monotonic() < deadline:  # released threads leave the count
        await asyncio.sleep(0.02)


async def test_hung_calls_warn_at_each_quarter_then_stop_the_run() -> None:
    """max_hung=4: a warning naming the tool at 1, 2 and 3 hung calls, once each; the next call
    of any sync tool raises ToolsHung naming the tool and the fix (not `unavailable`)."""
    RELEASE.clear()
    warnings: list[str] = []
    ex = ToolExecutor([stuck, add], timeout=0.1, max_threads=2, max_hung=4, warn=warnings.append)
    try:
        for i in range(4):  # one by one: each timeout abandons one more thread
            await ex.run([call("stuck", i, seconds=1)], {})
        assert [w.split(" of at most")[0] for w in warnings] == ["1", "2", "3"]
        assert all("'stuck'" in w and "tool_timeout (0.1 s)" in w for w in warnings)
        with pytest.raises(ToolsHung) as caught:
            await ex.run([call("add", 0, a=1, b=2)], {})
        message = str(caught.value)
        assert "\n" not in message and "4 sync tool calls hang" in message
        assert "hanging: 'stuck' 4" in message and "max_hung_tool_calls=4" in message
        assert "--resume" in message
        assert len(warnings) == 3  # once per threshold
    finally:
        RELEASE.set()
        ex.close()


async def test_queue_wait_is_not_charged_to_the_tool() -> None:
    """With one thread, 3 calls of 0.15 s under a 0.25 s timeout all succeed (queued, not slow)."""

    def slow(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long.
        """
        time.sleep(seconds)
        return "ok"

    ex = ToolExecutor([slow], timeout=0.25, max_threads=1)
    results = await ex.run([call("slow", i, seconds=0.15) for i in range(3)], {})
    ex.close()
    assert [r.content for r in results] == ["ok"] * 3


def test_tool_threads_cancel_queued_work_and_replace_abandoned() -> None:
    gate = threading.Event()
    pool = ToolThreads(1)
    first = pool.submit(gate.wait)
    queued = pool.submit(lambda: "never")
    time.sleep(0.05)
    pool.abandon(queued)  # not started: cancelled outright
    assert queued.cancelled()
    pool.abandon(first)  # running: its slot goes to a fresh thread
    assert pool.abandoned == 1
    assert pool.submit(lambda: 7).result(timeout=5) == 7
    gate.set()
    pool.close()


def _tool_then_answer(tool: str):
    """A fake-server script: call `tool` on the first turn, then answer 4."""

    def script(req):
        if any(m["role"] == "tool" for m in req["messages"]):
            return FakeReply(text="The answer is 4.")
        return FakeReply(tool_calls=[{"name": tool, "arguments": {"seconds": 1}}])

    return script


def test_eval_with_a_hung_tool_exits_promptly_and_fails_loudly(tmp_path) -> None:
    """Every episode's tool hangs for good: the run ends, says FAILED, exits 1, and the process
    exits at once (no thread of the hung tool keeps it alive)."""
    out = tmp_path / "hung"
    with FakeOpenAIServer(script=_tool_then_answer("hang")) as srv:
        cmd = [
            sys.executable,
            "-m",
            "looprl.cli.main",
            "eval",
            HANG_ENV,
            "--base-url",
            srv.base_url,
        ]
        cmd += ["--model", "fake-model", "-n", "3", "-r", "2", "--output", str(out)]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        seconds = time.monotonic() - t0
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED: 6 of 6 episodes errored (6 infrastructure)" in proc.stdout
    assert seconds < 60  # without daemon threads the process never exits
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "failed" and meta["summary"]["infra_errors"] == 6
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["errors"][0]["kind"] == "infra" for r in rows)
    assert all("'hang'" in r["errors"][0]["message"] for r in rows)


def test_eval_resume_reruns_groups_lost_to_a_dead_server(tmp_path, capsys, monkeypatch) -> None:
    import looprl.cli.eval

    out = tmp_path / "dead"
    dead = FakeOpenAIServer(script=["x"]).start()
    dead_url = dead.base_url
    dead.stop()  # nothing listens there now
    args = ["eval", "calculator", "--model", "fake-model", "-n", "3", "-r", "2"]
    args += ["--output", str(out)]
    assert main([*args, "--base-url", dead_url]) == 2  # the preflight finds it: nothing written
    assert not out.exists() and dead_url in capsys.readouterr().err
    # a server that dies after the preflight: every episode errors, the run fails
    monkeypatch.setattr(looprl.cli.eval, "preflight", lambda url, key: None)
    assert main([*args, "--base-url", dead_url]) == 1
    monkeypatch.undo()
    first = json.loads((out / "metadata.json").read_text())
    assert first["status"] == "failed" and first["summary"]["infra_errors"] == 6
    assert "FAILED" in capsys.readouterr().out

    def solver(req):
        if any(m["role"] == "tool" for m in req["messages"]):
            return FakeReply(text=f"The answer is {req['messages'][-1]['content']}.")
        expr = req["messages"][-1]["content"].removeprefix("What is ").removesuffix("?")
        return FakeReply(tool_calls=[{"name": "calculate", "arguments": {"expression": expr}}])

    with FakeOpenAIServer(script=solver) as srv:
        assert main([*args, "--base-url", srv.base_url, "--resume"]) == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "finished"
    assert meta["summary"]["scored_episodes"] == 6 and meta["summary"]["reward_mean"] == 1.0
    assert len((out / "results.jsonl").read_text().splitlines()) == 6
    retried = [json.loads(line) for line in (out / "retried.jsonl").read_text().splitlines()]
    assert len(retried) == 6 and all(r["errors"][0]["kind"] == "infra" for r in retried)


def test_error_headline_warns_below_half_and_fails_from_half() -> None:
    base = {"scored_episodes": 0, "infra_errors": 1}
    assert error_headline({"episodes": 10, "rollout_errors": 0, **base}) == ("", False)
    text, failed = error_headline({"episodes": 10, "rollout_errors": 1, **base})
    assert not failed and text.startswith("warning: 1 of 10 episodes errored (1 infrastructure)")
    text, failed = error_headline({"episodes": 10, "rollout_errors": 5, **base})
    assert failed and "(1 infrastructure, 4 environment)" in text


async def test_prompt_without_room_to_generate_is_not_scored(tiny_tokenizer) -> None:
    env = load_environment()
    env.limits = Limits(max_turns=2, max_tokens_per_turn=32, max_context_tokens=8)
    engine = ScriptedEngine(["The answer is 4."], tiny_tokenizer)
    task = env.get_tasks("eval", 1, seed=0)[0]
    [ep] = await run_group(
        env, engine, task, 1, renderer=Renderer(tiny_tokenizer, env.tool_schemas)
    )
    assert engine.calls == 0 and ep.num_turns == 0
    assert ep.rollout_error and not ep.rewards and ep.reward == 0.0
    assert "leaving no room to generate within max_context_tokens=8" in ep.errors[0]["message"]
    summary = summarize([ep], rollouts_per_task=1)
    assert summary["scored_episodes"] == 0 and summary["rollout_errors"] == 1


def _some_answer_then_all_hang(answered: int):
    """A fake-server script: the first `answered` episodes answer at once, the rest call `hang`
    on every turn."""
    lock, firsts = threading.Lock(), [0]

    def script(req):
        if not any(m["role"] == "tool" for m in req["messages"]):
            with lock:
                firsts[0] += 1
                if firsts[0] <= answered:
                    return FakeReply(text="The answer is 4.")
        return FakeReply(tool_calls=[{"name": "hang", "arguments": {"seconds": 1}}])

    return script


def _eval_hang(srv, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "looprl.cli.main", "eval", HANG_ENV, "--base-url", srv.base_url]
    cmd += ["--model", "fake-model", "-n", "6", "-r", "1", "--output", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_eval_stops_with_one_line_when_tools_hang_and_resumes(tmp_path) -> None:
    """max_hung_tool_calls=4: 2 episodes answer, 4 hang their tool: a warning per quarter, then
    the evaluation stops with one line and exit 1; --resume keeps the 2 and runs the other 4."""
    out = tmp_path / "hung"
    limit = ("--env.max_hung_tool_calls", "4")
    with FakeOpenAIServer(script=_some_answer_then_all_hang(2)) as srv:
        proc = _eval_hang(srv, out, *limit)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "RuntimeWarning" not in x]  # runpy's
    assert line.startswith("error: 4 sync tool calls hang on their threads") and "'hang' 4" in line
    assert "--resume" in line
    warned = [w for w in proc.stdout.splitlines() if w.startswith("warning:")]
    assert [w.split()[1] for w in warned] == ["1", "2", "3"] and all("'hang'" in w for w in warned)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "failed" and meta["error"] == line.removeprefix("error: ")
    kept = (out / "results.jsonl").read_text().splitlines()
    assert len(kept) == 2  # the episodes that finished before the stop
    with FakeOpenAIServer(script=_some_answer_then_all_hang(6)) as srv:
        proc = _eval_hang(srv, out, *limit, "--resume")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = (out / "results.jsonl").read_text().splitlines()
    assert rows[:2] == kept and len(rows) == 6
    assert json.loads((out / "metadata.json").read_text())["status"] == "finished"


def test_eval_with_killable_tools_answers_every_call_past_the_limit(tmp_path) -> None:
    """The same run with tool_isolation="process": the hung calls are killed, so 16 of them
    (4 episodes x 4 turns) pass the limit of 4 without a stop and every episode is written."""
    out = tmp_path / "killed"
    extra = ("--env.max_hung_tool_calls", "4", "--env.tool_isolation", "process")
    with FakeOpenAIServer(script=_some_answer_then_all_hang(2)) as srv:
        proc = _eval_hang(srv, out, *extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # 4 of 6 episodes are infra errors
    assert "FAILED: 4 of 6 episodes errored (4 infrastructure)" in proc.stdout
    assert "hang on their threads" not in proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    assert sorted(r["tool_errors"].get("timeout", 0) for r in rows) == [0, 0, 4, 4, 4, 4]


def test_eval_that_crashes_says_so_in_metadata(tmp_path, monkeypatch) -> None:
    import looprl.eval.run

    async def broken(*args, **kwargs):
        raise RuntimeError("bug in the loop")

    monkeypatch.setattr(looprl.eval.run, "evaluate", broken)
    out = tmp_path / "crash"
    with pytest.raises(RuntimeError, match="bug in the loop"):
        main(["eval", "calculator", "--model", "tiny", "-n", "1", "-r", "1", "--output", str(out)])
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["status"] == "crashed" and meta["error"] == "RuntimeError: bug in the loop"
    assert "--resume" in meta["resume_hint"]


def test_server_tool_calls_get_the_strict_json_rules() -> None:
    from looprl.engines.openai_engine import _parse_tool_call

    for args in ('{"expression": NaN}', '{"expression": "\\ud800"}', '{"x": 1e999}'):
        c = _parse_tool_call({"function": {"name": "calculate", "arguments": args}}, 0)
        assert c.arguments == {} and c.raw == args  # not passed on to the tool; kept verbatim
    ok = _parse_tool_call({"function": {"name": "calculate", "arguments": '{"x": "1"}'}}, 0)
    assert ok.arguments == {"x": "1"}


def lookup(x: int = 5) -> str:
    """Look up x.

    Args:
        x: what to look up.
    """
    return f"found {x}"


@pytest.mark.parametrize(
    "arguments, expected",
    [
        ('{"x": 1,', "Expecting property name enclosed in double quotes: line 1 column 9"),
        ("not json", "Expecting value: line 1 column 1 (char 0)"),
        ("[1]", "an array"),
    ],
)
async def test_server_tool_calls_with_bad_json_are_malformed_not_run(arguments, expected) -> None:
    """A structured call whose `arguments` string is not a JSON object is answered
    `malformed_json` with the parser's message; the tool never runs with its defaults."""
    result = await _one_structured_call(arguments)
    assert result.tool_errors == {MALFORMED_JSON: 1}
    tool_message = result.messages[-2]  # then the closing answer
    assert tool_message.role == "tool" and expected in tool_message.content
    assert "found" not in tool_message.content
    assert result.messages[-3].tool_calls[0].raw == arguments  # the call the model wrote is kept


async def test_server_tool_calls_with_empty_object_run_with_defaults() -> None:
    result = await _one_structured_call("{}")
    assert result.tool_errors == {}
    assert result.messages[-2].content == "found 5"


async def _one_structured_call(arguments: str):
    """One episode on a fake server: call `lookup` with `arguments` verbatim, then answer."""
    from looprl import Rubric, ToolEnv
    from looprl.engines.openai_engine import OpenAIEngine
    from looprl.rollout.loop import rollout
    from looprl.types import Message, Task

    def script(req):
        if any(m["role"] == "tool" for m in req["messages"]):
            return FakeReply(text="done")
        return FakeReply(tool_calls=[{"name": "lookup", "arguments": arguments}])

    env = ToolEnv(name="lookup", tools=[lookup], rubric=Rubric([]))
    task = Task(id="t", prompt=[Message(role="user", content="look up")])
    with FakeOpenAIServer(script=script) as srv:
        engine = OpenAIEngine(srv.base_url, "fake-model", backoff=0.01)
        try:
            return await rollout(env, engine, task, renderer=None)
        finally:
            await engine.close()
            env.executor.close()


def test_a_burst_of_sync_calls_gets_a_thread_each() -> None:
    """Four 0.3 s calls submitted at once run side by side, even when one worker sat idle."""
    pool = ToolThreads(8)
    pool.submit(lambda: None).result()  # one idle worker
    time.sleep(0.05)
    gate = threading.Barrier(4, timeout=5)  # passes only if all four run at the same time
    futures = [pool.submit(gate.wait) for _ in range(4)]
    assert sorted(f.result(timeout=10) for f in futures) == [0, 1, 2, 3]
    pool.close()
