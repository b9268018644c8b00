"""The python tools built on a sandbox: schemas, hidden session ids, and the messages the model reads."""

from __future__ import annotations

from looprl.sandbox import (
    ExecResult,
    Executor,
    IsolationReport,
    format_result,
    make_python_tools,
    new_session_id,
)
from looprl.sandbox.tool import SESSION_KEY
from looprl.tools import ToolExecutor, make_tool
from looprl.types import ToolCall


class _ScriptedExecutor(Executor):
    """Returns canned results and records what it was asked to run."""

    def __init__(self, result: ExecResult) -> None:
        super().__init__()
        self.result = result
        self.calls: list[tuple[str, str | None, float | None, str | None]] = []

    async def execute(self, code, *, session_id=None, timeout=None, caller=None):
        self.calls.append(
            (code, session_id, timeout, caller)
        )  # the arguments as the tool gave them
        return self.result

    async def _run(self, code, session_id, timeout, who):
        raise AssertionError("execute is overridden: the raw arguments are what this test checks")

    def isolation_report(self) -> IsolationReport:
        return IsolationReport("scripted", "weak")


def test_schemas_show_code_only_and_hide_the_session():
    python, python_session = make_python_tools(_ScriptedExecutor(ExecResult("ok")))
    for fn in (python, python_session):
        tool = make_tool(fn)
        params = tool.schema["function"]["parameters"]
        assert list(params["properties"]) == ["code"] and params["required"] == ["code"]
        assert "Python source" in params["properties"]["code"]["description"]
    assert make_tool(python_session).hidden == {"session_id": SESSION_KEY}
    assert make_tool(python).hidden == {"caller": SESSION_KEY}  # optional: for fair queueing


async def test_session_tool_gets_its_id_from_the_episode_state():
    ex = _ScriptedExecutor(ExecResult("ok", stdout="3\n"))
    python, python_session = make_python_tools(ex, timeout=2.0)
    tools = ToolExecutor([python, python_session], timeout=5)
    sid = new_session_id()
    assert sid != new_session_id() and sid.startswith("ep-")
    tools.check_state({SESSION_KEY: sid})
    result = await tools.run_one(
        ToolCall("python_session", {"code": "print(3)"}, id="c1"), {SESSION_KEY: sid}
    )
    assert "status: ok" in result.content and "3" in result.content
    await tools.run_one(ToolCall("python", {"code": "1"}, id="c2"), {})
    await tools.run_one(ToolCall("python", {"code": "2"}, id="c3"), {SESSION_KEY: sid})
    assert ex.calls == [
        ("print(3)", sid, 2.0, None),
        ("1", None, 2.0, None),  # no episode id in the state: the call is a caller of its own
        ("2", None, 2.0, sid),  # stateless, but queued as the episode's call
    ]


def test_format_result_says_what_happened_and_what_to_do():
    ok = format_result(ExecResult("ok", stdout="4\n", value="5"))
    assert ok == "status: ok\nstdout:\n4\nvalue: 5"
    assert "use print()" in format_result(ExecResult("ok"))
    t = format_result(ExecResult("timeout", message="the code ran longer than the 2 s time limit"))
    assert t.startswith("status: timeout\nmessage: the code ran longer") and "faster" in t
    e = format_result(
        ExecResult(
            "error", stderr="Traceback ...\nZeroDivisionError: x", message="ZeroDivisionError: x"
        )
    )
    assert "stderr:\nTraceback" in e
    s = format_result(ExecResult("sandbox_error", message="worker died"))
    assert "not your code's fault" in s
    long = format_result(
        ExecResult("output_limit", stdout="a" * 10_000 + "END", truncated=True), max_chars=1000
    )
    assert (
        "characters cut" in long
        and long.count("a") < 1100
        and "END" in long
        and "cut at the sandbox" in long
    )
