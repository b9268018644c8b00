"""MCP tools (looprl.mcp): a local MCP server's tools run through the executor over stdio and HTTP."""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import check_token_invariants, run_episode

pytest.importorskip("mcp", reason="the mcp extra: pip install -e '.[mcp]'")

from looprl.envs.base import ToolEnv  # noqa: E402
from looprl.kit import tool_call_validity  # noqa: E402
from looprl.mcp import (
    MCP_ERROR,
    MCPServer,
    MCPStartError,
    MCPTools,
    mcp_params,
    mcp_tool_schema,
)  # noqa: E402
from looprl.mcp import config as mcp_config  # noqa: E402
from looprl.rubrics import Rubric  # noqa: E402
from looprl.tools.executor import TIMEOUT, UNAVAILABLE  # noqa: E402
from looprl.tools.schema import make_tool  # noqa: E402
from looprl.types import Message, Task  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SERVER = str(Path(__file__).parent / "mcp_servers" / "notes_server.py")
TASK = Task(id="t", prompt=[Message(role="user", content="use the tools")])


def stdio(*args: str, **fields) -> MCPServer:
    """The test server over stdio."""
    return MCPServer(command=[sys.executable, SERVER, *args], **fields)


def call(name: str, **arguments) -> str:
    """One Hermes tool-call block."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, seconds: float = 15.0) -> bool:
    """True once the process has exited (polls; exit is asynchronous after a kill)."""
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture(scope="module")
def http_url(tmp_path_factory) -> Iterator[str]:
    """The test server over streamable HTTP on a free 127.0.0.1 port, stopped after the module."""
    with http_server(tmp_path_factory.mktemp("mcp")) as url:
        yield url


@contextlib.contextmanager
def http_server(folder: Path, *args: str) -> Iterator[str]:
    """The test server over streamable HTTP on a free 127.0.0.1 port while in the block."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (folder / "server.log").open("w")
    command = [sys.executable, SERVER, "--http", str(port), *args]
    proc = subprocess.Popen(command, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the HTTP server exited: {Path(log.name).read_text()}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the HTTP server did not listen within 60 s"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def stdio_tools() -> Iterator[MCPTools]:
    """The stdio server, started once for the module's schema checks."""
    with MCPTools([stdio()]) as tools:
        yield tools


def test_server_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="exactly one of command"):
        MCPServer()
    with pytest.raises(ValueError, match="exactly one of command"):
        MCPServer(command=["x"], url="http://a")
    with pytest.raises(ValueError, match="non-empty list of strings"):
        MCPServer(command="python server.py")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must start with http"):
        MCPServer(url="localhost:8000/mcp")
    with pytest.raises(ValueError, match=r"unknown MCP server field\(s\) \['cmd'\]; choose from"):
        MCPServer.from_config({"cmd": ["python"]})
    table = {"url": "http://127.0.0.1:1/mcp", "prefix": "web_", "per_episode": True}
    assert MCPServer.from_config(table) == MCPServer(**table)


def test_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(mcp_config.importlib.metadata, "version", missing)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[mcp\]'"):
        MCPTools([stdio()])
    monkeypatch.setattr(mcp_config.importlib.metadata, "version", lambda name: "1.26.0")
    with pytest.raises(ImportError, match=r"mcp>=2 \(the installed version is 1.26.0\)"):
        MCPTools([stdio()])


def test_schema_conversion_drops_titles_inlines_refs_and_keeps_recursion() -> None:
    raw = {
        "type": "object",
        "title": "walkArguments",
        "properties": {
            "start": {"$ref": "#/$defs/Point", "description": "Where to start."},
            "tree": {"$ref": "#/$defs/Node"},
            "steps": {"title": "Steps", "type": "integer", "default": 1},
        },
        "required": ["start", "tree"],
        "$defs": {
            "Point": {
                "title": "Point",
                "type": "object",
                "properties": {"x": {"title": "X", "type": "number"}},
                "required": ["x"],
            },
            "Node": {
                "title": "Node",
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
            },
        },
    }
    parameters = mcp_tool_schema("walk", " Walk. ", raw)["function"]["parameters"]
    assert parameters["properties"]["start"] == {
        "type": "object",
        "properties": {"x": {"type": "number"}},
        "required": ["x"],
        "description": "Where to start.",
    }
    assert parameters["properties"]["steps"] == {"type": "integer", "default": 1}
    assert parameters["properties"]["tree"]["properties"]["kids"]["items"] == {
        "$ref": "#/$defs/Node"
    }
    assert set(parameters["$defs"]) == {"Node"} and parameters["required"] == ["start", "tree"]
    params, shown = mcp_params(raw, "walk")
    assert shown == "start: object, tree: object, steps: integer = 1"
    assert [p.required for p in params.values()] == [True, True, False]
    assert params["start"].adapter.validate_python({"x": 1.5}) == {"x": 1.5}
    with pytest.raises(ValueError, match="'x' is a required property"):
        params["start"].adapter.validate_python({})
    with pytest.raises(ValueError, match="must be a JSON object schema"):
        mcp_params({"type": "string"}, "bad")


def test_server_tools_get_the_schema_a_python_tool_gets(stdio_tools: MCPTools) -> None:
    def add(a: int, b: int = 0) -> int:
        """Add two integers."""
        return a + b

    tools = {t.name: t for t in stdio_tools.tools}
    assert set(tools) == {"add", "remember", "recall", "norm", "fail", "sleep", "crash", "big"}
    assert tools["add"].schema == make_tool(add).schema
    assert tools["add"].signature == "add(a: integer, b: integer = 0)"
    assert tools["norm"].schema["function"]["parameters"]["properties"]["point"]["properties"] == {
        "x": {"type": "number"},
        "y": {"type": "number"},
    }


def test_scripted_rollout_calls_the_tools_through_the_executor(tiny_tokenizer) -> None:
    env = ToolEnv(name="notes", mcp=[stdio()], rubric=Rubric([]))
    try:
        script = [
            call("remember", text="milk") + call("remember", text="eggs"),
            call("recall") + call("add", a=2, b="x") + call("norm", point={"x": 3, "y": 4}),
            call("fail", message="the shelf is empty") + call("nope"),
            "done",
        ]
        ep = _run(env, script, tiny_tokenizer)
        check_token_invariants(ep, env, tiny_tokenizer)  # tool output is mask 0, as for any tool
        tool_text = [m.content for m in ep.messages if m.role == "tool"]
        assert tool_text[:2] == ["noted (1 so far)", "noted (2 so far)"]
        assert tool_text[2] == "milk\neggs" and tool_text[4] == "5.0"
        assert tool_text[3].startswith(
            "Error: invalid argument(s) for 'add': b: 'x' is not of type"
        )
        assert tool_text[5] == "Error: Error executing tool fail: the shelf is empty"
        assert ep.tool_errors == {"invalid_argument": 1, MCP_ERROR: 1, "unknown_tool": 1}
        assert [o.error_kind for o in ep.tool_outcomes][-2:] == [MCP_ERROR, "unknown_tool"]
        assert not ep.errors and ep.num_tool_calls == 7
        assert tool_call_validity(ep) == pytest.approx(1 - 3 / 7)  # mcp_error counts as failed
        again = _run(env, [call("recall"), "done"])  # one session per environment: state stays
        assert again.messages[-2].content == "milk\neggs"
    finally:
        env.close()


def _run(env: ToolEnv, script: list[str], tokenizer=None):
    import asyncio

    return asyncio.run(run_episode(env, TASK, script, tokenizer))


def test_a_slow_tool_times_out_as_infra_and_the_session_survives() -> None:
    env = ToolEnv(name="slow", mcp=[stdio()], rubric=Rubric([]), tool_timeout=0.5)
    try:
        ep = _run(env, [call("sleep", seconds=30), call("add", a=1, b=2), "done"])
        assert ep.tool_outcomes[0].error_kind == TIMEOUT and ep.tool_outcomes[0].infra
        assert ep.messages[2].content == "Error: tool 'sleep' timed out after 0.5 s"
        assert ep.messages[4].content == "3" and ep.errors[0]["kind"] == "infra"
    finally:
        env.close()


def test_http_sessions_per_environment_and_per_episode(http_url: str) -> None:
    server = MCPServer(url=http_url, headers={"Authorization": "Bearer test"})  # sent, not checked
    shared = ToolEnv(name="shared", mcp=[server], rubric=Rubric([]))
    fresh = ToolEnv(
        name="fresh",
        mcp=[{"url": http_url, "per_episode": True, "prefix": "n_"}],
        rubric=Rubric([]),
    )
    try:
        counts = [
            _run(shared, [call("remember", text="a"), "ok"]).messages[-2].content for _ in "ab"
        ]
        assert counts == ["noted (1 so far)", "noted (2 so far)"]
        script = [call("n_remember", text="a"), "ok"]
        counts = [_run(fresh, script).messages[-2].content for _ in "ab"]
        assert counts == ["noted (1 so far)", "noted (1 so far)"]
    finally:
        shared.close()
        fresh.close()


def test_close_stops_the_server_and_later_calls_are_unavailable(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    env = ToolEnv(name="n", mcp=[stdio("--pid-file", str(pid_file))], rubric=Rubric([]))
    pid = int(pid_file.read_text())
    assert alive(pid)
    env.close()
    assert wait_gone(pid) and isinstance(env.sources[-1], MCPTools) and env.sources[-1].closed
    ep = _run(env, [call("add", a=1), "done"])
    assert ep.tool_outcomes[0].error_kind == UNAVAILABLE and ep.tool_outcomes[0].infra
    env.close()  # idempotent
    ToolEnv(name="n", mcp=[stdio("--pid-file", str(pid_file))], rubric=Rubric([]))
    gc.collect()  # an environment nobody holds stops its server too
    assert wait_gone(int(pid_file.read_text()))


def test_a_server_that_dies_makes_calls_unavailable(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with MCPTools([stdio("--pid-file", str(pid_file))]) as tools:
        env = ToolEnv(name="n", tools=tools.tools, rubric=Rubric([]))
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        ep = _run(env, [call("add", a=1), "done"])
        assert ep.tool_outcomes[0].error_kind == UNAVAILABLE and ep.tool_outcomes[0].infra
        assert "is not connected" in ep.messages[2].content


def test_failures_at_start_name_the_server_and_leave_no_process(tmp_path: Path, http_url) -> None:
    crash = [sys.executable, "-c", "import sys; sys.stderr.write('bad config file'); sys.exit(3)"]
    with pytest.raises(
        MCPStartError, match=r"(?s)MCP server .* failed to start: .*bad config file"
    ):
        ToolEnv(name="n", mcp=[MCPServer(command=crash)], rubric=Rubric([]))
    with pytest.raises(MCPStartError, match="failed to start: ConnectError"):
        MCPTools([MCPServer(url="http://127.0.0.1:9/mcp")])  # nothing listens on port 9
    with pytest.raises(MCPStartError, match="failed to start: FileNotFoundError"):
        MCPTools([MCPServer(command=["/nonexistent/mcp-server"])])
    pid_file = tmp_path / "pid"

    def add(a: int) -> int:
        """A Python tool whose name clashes with the server's."""
        return a

    with pytest.raises(ValueError, match="two tools are named 'add'"):
        ToolEnv(name="n", tools=[add], mcp=[stdio("--pid-file", str(pid_file))], rubric=Rubric([]))
    assert wait_gone(int(pid_file.read_text()))
    with pytest.raises(ValueError, match=r"has no tool\(s\) \['sub'\]; it offers"):
        MCPTools([MCPServer(url=http_url, tools=["add", "sub"])])
    with pytest.raises(ValueError, match="give one server a prefix"):
        MCPTools([MCPServer(url=http_url, tools=["add"]), MCPServer(url=http_url, tools=["add"])])


CHILD = """
import os, signal, sys, time
from looprl.envs.base import ToolEnv
from looprl.mcp import MCPServer
from looprl.rubrics import Rubric
env = ToolEnv(name="n", mcp=[MCPServer(command=[sys.executable, {server!r}, "--pid-file", {pid!r}])],
              rubric=Rubric([]))
print("ready", flush=True)
if {how!r} == "interrupt":
    # a shell starting this in the background hands it SIGINT ignored; a terminal would not
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C would: KeyboardInterrupt, then exit
    time.sleep(30)
else:
    os.kill(os.getpid(), signal.SIGKILL)  # no handler runs: the server must see EOF and exit
"""


@pytest.mark.parametrize("how", ["interrupt", "kill"])
def test_no_orphan_server_after_ctrl_c_or_kill(tmp_path: Path, how: str) -> None:
    pid_file = tmp_path / "pid"
    code = textwrap.dedent(CHILD).format(server=SERVER, pid=str(pid_file), how=how)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)  # fmt: skip
    assert "ready" in done.stdout, done.stderr
    expected = -signal.SIGKILL if how == "kill" else -signal.SIGINT
    assert done.returncode == expected, done.stderr
    assert wait_gone(int(pid_file.read_text()))


@pytest.mark.slow
def test_two_training_steps_with_an_mcp_backed_environment(tmp_path: Path, capsys) -> None:
    from looprl.trainer.config import load_config
    from looprl.trainer.trainer import Trainer

    pid_file = tmp_path / "pid"
    server = {"command": [sys.executable, SERVER, "--pid-file", str(pid_file)], "prefix": "notes_"}
    cfg = load_config(None, {
        "model.name": "tiny", "env.name": "calculator", "env.kwargs": {"mcp": [server]},
        "rollout.tasks_per_step": 2, "rollout.rollouts_per_task": 2, "trainer.steps": 2,
        "trainer.eval_every": 0, "trainer.save_every": 2, "optim.lr": 1e-3,
        "run.output_dir": str(tmp_path), "run.name": "mcp", "run.tensorboard": False,
    })  # fmt: skip
    trainer = Trainer(cfg)
    sync, first = trainer._sync, []

    def sync_then_kill_the_server(version: int) -> dict[str, float]:
        """After step 1 the server dies, as a crashed one would."""
        if version == 1:
            first.append(int(pid_file.read_text()))
            os.kill(first[0], signal.SIGKILL)
            assert wait_gone(first[0])
        return sync(version)

    trainer._sync = sync_then_kill_the_server  # type: ignore[method-assign]
    try:
        trainer.run()
        names = {s["function"]["name"] for s in trainer.env.tool_schemas}
        assert {"notes_add", "notes_remember"} <= names  # offered to the model next to its own
        rows = (tmp_path / "mcp" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(row)["step"] for row in rows] == [1, 2]
        printed = " ".join(capsys.readouterr().out.split())
        assert printed.count("exited (code -9); restarted") == 1  # before step 2, not again
        assert int(pid_file.read_text()) != first[0]
    finally:
        trainer.env.close()
    assert wait_gone(int(pid_file.read_text()))


def test_the_docs_example_runs() -> None:
    doc = (ROOT / "docs" / "environments.md").read_text()
    section = doc[doc.index("## MCP tools") :]
    code = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert code is not None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.chdir(ROOT):
        exec(code.group(1).replace('"python"', repr(sys.executable)), {})
    assert "'notes_add', 'notes_remember'" in printed.getvalue()


BIG_SERVER = str(Path(__file__).parent / "mcp_servers" / "big_reply_server.py")


def _run_batch(env: ToolEnv, script: list[str], rollouts: int = 2):
    """One batch as the trainer and `looprl eval` run it: `run_groups`, which first checks the
    environment's servers (`ensure_alive`)."""
    import asyncio

    from looprl.engines.scripted import ScriptedEngine
    from looprl.rollout.loop import run_groups

    engine = ScriptedEngine(script)
    groups = asyncio.run(run_groups(env, engine, [(TASK, list(range(rollouts)))], renderer=None))
    return groups[0]


def test_an_exited_server_is_restarted_before_the_next_batch(tmp_path: Path, capsys) -> None:
    pid_file = tmp_path / "pid"
    env = ToolEnv(name="n", mcp=[stdio("--pid-file", str(pid_file))], rubric=Rubric([]))
    try:
        first = int(pid_file.read_text())
        batch = _run_batch(env, [call("crash", code=3), "done"])  # the server exits mid-batch
        for ep in batch:  # the calls in flight when it died: infra, never the model's fault
            assert ep.tool_outcomes[0].error_kind == UNAVAILABLE and ep.tool_outcomes[0].infra
            assert ep.errors[0]["kind"] == "infra"
        assert wait_gone(first)
        assert "restarted" not in capsys.readouterr().out
        batch = _run_batch(env, [call("add", a=1, b=2), "done"])
        assert [ep.messages[2].content for ep in batch] == ["3", "3"]
        assert all(not ep.errors and ep.tool_errors == {} for ep in batch)
        printed = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
        label = f"{sys.executable} {SERVER} --pid-file {pid_file}"
        line = f"MCP server '{label}' exited (code 3, stderr ends: crashing on purpose with code 3); restarted"
        assert line in printed
        second = int(pid_file.read_text())
        assert second != first and alive(second)
    finally:
        env.close()
    assert wait_gone(second)


@pytest.mark.slow
def test_a_server_that_keeps_exiting_stops_the_run_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from looprl.mcp import tools as mcp_tools

    monkeypatch.setattr(mcp_tools, "MAX_RESTARTS", 1)
    pid_file = tmp_path / "pid"
    env = ToolEnv(name="n", mcp=[stdio("--pid-file", str(pid_file))], rubric=Rubric([]))
    try:
        _run(env, [call("crash", code=4), "done"])
        asyncio.run(env.ensure_alive())  # restart 1 of 1
        asyncio.run(env.ensure_alive())  # found alive: the count starts again
        _run(env, [call("crash", code=4), "done"])
        asyncio.run(env.ensure_alive())  # restart 1 of 1 again
        _run(env, [call("crash", code=5), "done"])
        with pytest.raises(SystemExit) as stop:
            asyncio.run(env.ensure_alive())
        message = str(stop.value.code)
        assert message.startswith("error: MCP server ") and "\n" not in message
        assert (
            "exited (code 5, stderr ends: crashing on purpose with code 5) after 1 restarts "
            "in a row, so the run stops" in message
        )
        ep = _run(env, [call("add", a=1), "done"])  # no server now: infra, not the model's fault
        assert ep.tool_outcomes[0].error_kind == UNAVAILABLE and ep.tool_outcomes[0].infra
    finally:
        env.close()
    assert wait_gone(int(pid_file.read_text()))


def test_an_oversized_reply_is_dropped_unread_and_other_calls_answer() -> None:
    env = ToolEnv(name="big", mcp=[MCPServer(command=[sys.executable, BIG_SERVER])],
                  rubric=Rubric([]), tool_timeout=30)  # fmt: skip
    try:
        start = time.monotonic()
        ep = _run(env, [call("big") + call("add", a=1, b=2), call("add", a=2, b=2), "done"])
        seconds = time.monotonic() - start
        big, small, later = (m.content for m in ep.messages if m.role == "tool")
        assert big == (
            "Error: the reply was over 4194304 bytes (the server's max_reply_bytes), so it was "
            "dropped unread; ask for less"
        )
        assert ep.tool_outcomes[0].error_kind == MCP_ERROR and not ep.tool_outcomes[0].infra
        assert (small, later) == ("3", "4") and not ep.errors
        assert seconds < 5, seconds  # 50 MB drained, never parsed (the SDK's reader: minutes)
    finally:
        env.close()


@pytest.mark.parametrize("body", ["events", "json"])
def test_an_oversized_reply_over_http_is_an_mcp_error(
    http_url: str, tmp_path: Path, body: str
) -> None:
    with contextlib.ExitStack() as stack:
        url = http_url if body == "events" else stack.enter_context(
            http_server(tmp_path, "--json-response")
        )  # fmt: skip
        env = ToolEnv(name="big", mcp=[MCPServer(url=url, max_reply_bytes=100_000)],
                      rubric=Rubric([]), tool_timeout=30)  # fmt: skip
        stack.callback(env.close)
        script = [
            call("big", megabytes=0.2) + call("big", megabytes=0.03),
            call("add", a=1),
            "done",
        ]
        ep = _run(env, script)
        big, fits, later = (m.content for m in ep.messages if m.role == "tool")
        assert big == (
            "Error: the reply was over 100000 bytes (the server's max_reply_bytes), so it was "
            "dropped unread; ask for less"
        )
        assert fits == "x" * 4000 + "\n[truncated: 30000 chars, showing the first 4000]"
        assert ep.tool_outcomes[0].error_kind == MCP_ERROR and not ep.errors and later == "1"


def test_reply_id_is_the_top_level_one() -> None:
    from looprl.mcp.stdio import reply_id

    assert reply_id(b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"text":"xx') == 7
    assert reply_id(b'{"result":{"id":1,"text":"{\\"id\\": 2"},"id":"r-9","jsonrpc"') == "r-9"
    assert reply_id(b'{"jsonrpc":"2.0","result":{"id":1,"content":"xxxx') is None


def test_a_dangling_ref_refuses_the_tool_with_one_line(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    server = stdio("--dangling-ref", "--pid-file", str(pid_file))
    with pytest.raises(ValueError) as refused:
        MCPTools([server])
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"MCP tool 'norm' of '{server.label}': its input schema refers to "
                              "'#/$defs/Missing', which is not among its $defs ['Point']")  # fmt: skip
    assert message.endswith("leave the tool out with MCPServer(tools=[...the others])")
    assert wait_gone(int(pid_file.read_text()))
    keep = stdio("--dangling-ref", tools=["add"])
    with MCPTools([keep]) as tools:  # the fix the message names
        assert [t.name for t in tools.tools] == ["add"]
