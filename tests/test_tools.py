"""Tests for tool schemas (from signatures and docstrings) and the concurrent tool executor."""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict

from looprl.rendering.parser import HermesParser, ParseError
from looprl.tools import (
    ERROR_KINDS,
    EXCEPTION,
    INVALID_ARGUMENT,
    MALFORMED_JSON,
    MISSING_ARGUMENT,
    TIMEOUT,
    TRUNCATED,
    UNAVAILABLE,
    UNEXPECTED_ARGUMENT,
    UNKNOWN_TOOL,
    Hidden,
    ToolExecutor,
    ToolResult,
    count_tool_errors,
    make_tool,
    make_tools,
    parse_docstring,
    tool_schema,
)
from looprl.types import ToolCall

# ---------------------------------------------------------------- tools used below


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b (int): The second addend,
            zero when left out.

    Returns:
        The sum.
    """
    return a + b


async def aecho(text: str) -> str:
    """Echo text back (async)."""
    await asyncio.sleep(0)
    return text


def sleepy(seconds: float) -> str:
    """Block the calling thread for a while."""
    time.sleep(seconds)
    return f"slept {seconds}"


async def asleepy(seconds: float) -> str:
    """Sleep without blocking."""
    await asyncio.sleep(seconds)
    return "awake"


def boom(msg: str) -> str:
    """Always fails."""
    raise ValueError(msg)


def big(n: int) -> str:
    """Return n characters."""
    return "x" * n


def stats(values: list[float]) -> dict[str, float]:
    """Summary statistics."""
    return {"min": min(values), "max": max(values)}


def whoami(question: str, user: Annotated[dict[str, Any], Hidden("user")]) -> str:
    """Answer with the episode's user name."""
    return f"{question} -> {user['name']}"


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Point(BaseModel):
    x: int
    y: int = 0


class Box(TypedDict):
    w: float
    h: float


def call(name: str, call_id: str = "call_0", **arguments: Any) -> ToolCall:
    return ToolCall(name=name, arguments=arguments, id=call_id)


# ---------------------------------------------------------------- schema


def test_schema_from_signature_and_docstring() -> None:
    assert tool_schema(add) == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first addend."},
                    "b": {
                        "type": "integer",
                        "description": "The second addend, zero when left out.",
                        "default": 0,
                    },
                },
                "required": ["a"],
            },
        },
    }


def test_schema_types() -> None:
    def f(
        s: str,
        n: float,
        flag: bool,
        tags: list[str],
        weights: dict[str, float],
        mode: Literal["fast", "slow"],
        color: Color,
        p: Point,
        box: Box,
        maybe: Optional[int] = None,  # noqa: UP045 (the old spelling must work too)
        other: str | None = None,
    ) -> None:
        """Many types."""

    props = tool_schema(f)["function"]["parameters"]["properties"]
    assert props["s"] == {"type": "string"}
    assert props["n"] == {"type": "number"}
    assert props["flag"] == {"type": "boolean"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["weights"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"]}
    assert props["color"] == {"type": "string", "enum": ["red", "green"]}
    assert props["p"] == {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 0}},
        "required": ["x"],
    }
    assert props["box"]["properties"] == {"w": {"type": "number"}, "h": {"type": "number"}}
    assert props["maybe"] == {"type": ["integer", "null"], "default": None}
    assert props["other"] == {"type": ["string", "null"], "default": None}
    assert "title" not in str(tool_schema(f))


def test_hidden_parameters_are_not_in_schema() -> None:
    tool = make_tool(whoami)
    assert list(tool.schema["function"]["parameters"]["properties"]) == ["question"]
    assert tool.schema["function"]["parameters"]["required"] == ["question"]
    assert tool.hidden == {"user": "user"}
    assert tool.signature == "whoami(question: str)"


def test_no_parameters_and_no_docstring() -> None:
    def ping() -> str:
        return "pong"

    assert tool_schema(ping)["function"] == {
        "name": "ping",
        "description": "",
        "parameters": {"type": "object", "properties": {}, "required": []},
    }


def test_async_detection_and_signature() -> None:
    assert make_tool(aecho).is_async and not make_tool(add).is_async
    assert make_tool(add).signature == "add(a: int, b: int = 0)"


def test_parse_docstring_sections() -> None:
    desc, args = parse_docstring(
        """Summary line.

        Longer text.

        Args:
            x (int): first
                more about x
            *rest: ignored stars

        Raises:
            ValueError: not an argument.
        """
    )
    assert desc == "Summary line.\n\nLonger text."
    assert args == {"x": "first more about x", "rest": "ignored stars"}


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (lambda: None, "named functions"),
    ],
)
def test_lambda_needs_a_name(fn: Any, match: str) -> None:
    with pytest.raises(TypeError, match=match):
        make_tool(fn)
    assert make_tool(fn, name="noop").name == "noop"


def test_missing_hint_is_a_type_error() -> None:
    def f(a: int, b):  # type: ignore[no-untyped-def]
        """No hint on b."""

    with pytest.raises(TypeError, match=r"tool 'f', parameter 'b': missing type hint"):
        make_tool(f)


def test_unsupported_types_are_type_errors() -> None:
    def f(when: threading.Lock) -> None:
        """Not JSON."""

    def g(m: dict[int, str]) -> None:
        """Int keys."""

    def h(*args: int) -> None:
        """Var args."""

    class Local(BaseModel):
        a: int

    def k(x: Local) -> None:
        """A type this module's globals do not know (annotations are strings here)."""

    with pytest.raises(
        TypeError, match=r"parameter 'x': cannot resolve the annotation 'Local'.*module level"
    ):
        make_tool(k)
    with pytest.raises(TypeError, match=r"tool 'f', parameter 'when': unsupported type"):
        make_tool(f)
    with pytest.raises(TypeError, match=r"parameter 'm': dict keys must be str"):
        make_tool(g)
    with pytest.raises(TypeError, match=r"parameter 'args': \*args"):
        make_tool(h)


def test_duplicate_names() -> None:
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        make_tools([add, add])
    assert list(make_tools([add, aecho])) == ["add", "aecho"]


# ---------------------------------------------------------------- executor


async def test_sync_and_async_tools_and_json_results() -> None:
    ex = ToolExecutor([add, aecho, stats])
    results = await ex.run(
        [
            call("add", "call_0", a=2, b="3"),  # lax coercion "3" -> 3
            call("aecho", "call_1", text="hi"),
            call("stats", "call_2", values=[1, 5.5]),
        ],
        {},
    )
    assert [(r.call_id, r.name, r.content, r.error_kind) for r in results] == [
        ("call_0", "add", "5", None),
        ("call_1", "aecho", "hi", None),
        ("call_2", "stats", '{"min": 1.0, "max": 5.5}', None),
    ]
    assert all(r.seconds >= 0 and not r.truncated for r in results)
    msg = results[0].to_message()
    assert (msg.role, msg.tool_call_id, msg.name, msg.content) == ("tool", "call_0", "add", "5")
    ex.close()


async def test_calls_of_one_turn_run_concurrently() -> None:
    ex = ToolExecutor([sleepy, asleepy])
    for name in ("sleepy", "asleepy"):
        t0 = time.perf_counter()
        results = await ex.run(
            [call(name, "call_0", seconds=0.5), call(name, "call_1", seconds=0.5)], {}
        )
        elapsed = time.perf_counter() - t0
        assert [r.error_kind for r in results] == [None, None]
        assert elapsed < 0.9, (name, elapsed)
    ex.close()


async def test_blocking_sync_tool_does_not_block_event_loop() -> None:
    ex = ToolExecutor([sleepy])
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    task = asyncio.create_task(ticker())
    (r,) = await ex.run([call("sleepy", seconds=0.4)], {})
    task.cancel()
    assert r.content == "slept 0.4"
    assert (
        ticks >= 5
    )  # the loop kept ticking while the tool blocked its thread (0 if it blocked the loop)
    ex.close()


async def test_timeout() -> None:
    ex = ToolExecutor([asleepy, sleepy], timeout=0.1)
    t0 = time.perf_counter()
    results = await ex.run([call("asleepy", seconds=5), call("sleepy", "call_1", seconds=0.3)], {})
    assert time.perf_counter() - t0 < 1.0  # not the 5 s the tool wanted
    assert [r.error_kind for r in results] == [TIMEOUT, TIMEOUT]
    assert results[0].content == "Error: tool 'asleepy' timed out after 0.1 s"
    ex.close()


async def test_own_timeout_error_is_an_exception_not_a_timeout() -> None:
    async def flaky() -> str:
        """Raises its own TimeoutError."""
        raise TimeoutError("upstream took too long")

    (r,) = await ToolExecutor([flaky]).run([call("flaky")], {})
    assert (r.error_kind, r.content) == (EXCEPTION, "Error: TimeoutError: upstream took too long")


async def test_exception_message_without_traceback() -> None:
    (r,) = await ToolExecutor([boom]).run([call("boom", msg="bad input")], {})
    assert r.error_kind == EXCEPTION
    assert r.content == "Error: ValueError: bad input"


async def test_unknown_tool_lists_available() -> None:
    (r,) = await ToolExecutor([add, boom]).run([call("mul", a=1)], {})
    assert r.error_kind == UNKNOWN_TOOL
    assert r.content == "Error: unknown tool 'mul'. Available tools: add, boom."


async def test_missing_argument() -> None:
    (r,) = await ToolExecutor([add]).run([call("add", b=1)], {})
    assert r.error_kind == MISSING_ARGUMENT
    assert "missing required argument(s) 'a'" in r.content
    assert "add(a: int, b: int = 0)" in r.content


async def test_unexpected_argument_including_hidden_name() -> None:
    ex = ToolExecutor([add, whoami])
    r1, r2 = await ex.run(
        [call("add", a=1, c=2), call("whoami", "call_1", question="q", user={})], {"user": {}}
    )
    assert r1.error_kind == UNEXPECTED_ARGUMENT
    assert "unexpected argument(s) 'c'" in r1.content and "add(a: int, b: int = 0)" in r1.content
    assert r2.error_kind == UNEXPECTED_ARGUMENT and "'user'" in r2.content


async def test_invalid_argument_names_every_problem() -> None:
    def g(n: int, color: Color, p: Point) -> str:
        """Typed."""
        return f"{n} {color.value} {p.x}"

    ex = ToolExecutor([g])
    (bad,) = await ex.run([call("g", n="three", color="blue", p={"x": "a"})], {})
    assert bad.error_kind == INVALID_ARGUMENT
    assert "n: Input should be a valid integer" in bad.content and "(got 'three')" in bad.content
    assert "color: Input should be 'red' or 'green'" in bad.content
    assert "p.x: Input should be a valid integer" in bad.content
    assert "g(n: int, color: Color, p: Point)" in bad.content
    (good,) = await ex.run([call("g", n="3", color="green", p={"x": 1})], {})
    assert (good.error_kind, good.content) == (None, "3 green 1")


async def test_non_object_arguments_are_malformed() -> None:
    (r,) = await ToolExecutor([add]).run([ToolCall(name="add", arguments=[1, 2], id="c")], {})  # type: ignore[arg-type]
    assert r.error_kind == MALFORMED_JSON and "must be a JSON object" in r.content


async def test_truncation() -> None:
    ex = ToolExecutor([big], max_result_chars=100)
    (r,) = await ex.run([call("big", n=12345)], {})
    assert r.truncated and r.error_kind is None
    assert r.content == "x" * 100 + "\n[truncated: 12345 chars, showing the first 100]"
    (small,) = await ex.run([call("big", n=100)], {})
    assert not small.truncated and small.content == "x" * 100


async def test_hidden_state_injection() -> None:
    ex = ToolExecutor([whoami])
    (r,) = await ex.run([call("whoami", question="who?")], {"user": {"name": "ada"}})
    assert (r.error_kind, r.content) == (None, "who? -> ada")
    (missing,) = await ex.run([call("whoami", question="who?")], {})
    assert missing.error_kind == EXCEPTION
    assert "environment did not provide state 'user'" in missing.content
    assert ex.state_keys == {"user"}
    ex.check_state({"user": {}})
    with pytest.raises(
        ValueError, match=r"lacks hidden tool argument\(s\) \['user'\].*whoami.*setup_state"
    ):
        ex.check_state({})


async def test_hidden_parameter_default_used_when_state_lacks_key() -> None:
    def f(x: int, scale: Annotated[int, Hidden("scale")] = 10) -> int:
        """Scaled."""
        return x * scale

    ex = ToolExecutor([f])
    assert ex.state_keys == set()
    assert (await ex.run([call("f", x=2)], {}))[0].content == "20"
    assert (await ex.run([call("f", x=2)], {"scale": 3}))[0].content == "6"


async def test_parse_errors_become_malformed_json_results_in_order() -> None:
    ex = ToolExecutor([add])
    turn = HermesParser().parse(
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        "<tool_call>{bad</tool_call>"
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 2}}</tool_call>'
    )
    results = await ex.run_turn(turn, {})
    assert [(r.call_id, r.error_kind) for r in results] == [
        ("call_0", None),
        ("call_1", MALFORMED_JSON),
        ("call_2", None),
    ]
    assert results[1].content.startswith(
        "Error: invalid JSON in <tool_call>: Expecting property name"
    )
    direct = ex.error_result(
        ParseError("unclosed_tag", "never closed", "<tool_call>{", "call_7", "")
    )
    assert direct == ToolResult("call_7", "", "Error: never closed", MALFORMED_JSON, 0.0, False)


async def test_every_error_kind_is_counted() -> None:
    ex = ToolExecutor([add, boom, asleepy, big], timeout=0.1, max_result_chars=300)
    turn = HermesParser().parse("<tool_call>nope</tool_call>")
    results = await ex.run(
        [
            call("nope", "c0"),
            call("add", "c1"),
            call("add", "c2", a=1, z=1),
            call("add", "c3", a="x"),
            call("boom", "c4", msg="m"),
            call("asleepy", "c5", seconds=1),
            call("big", "c6", n=500),
        ],
        {},
    )
    results.append(ex.error_result(turn.errors[0]))
    counts = count_tool_errors(results)
    # `unavailable` needs hung threads: tests/test_tools_hung.py counts it
    assert counts == {kind: 1 for kind in ERROR_KINDS if kind != UNAVAILABLE} | {TRUNCATED: 1}


def test_executor_rejects_bad_settings_and_mismatched_mapping() -> None:
    with pytest.raises(ValueError, match="timeout must be > 0"):
        ToolExecutor([add], timeout=0)
    with pytest.raises(ValueError, match="max_result_chars must be >= 1"):
        ToolExecutor([add], max_result_chars=0)
    with pytest.raises(ValueError, match="differs from the tool's name 'add'"):
        ToolExecutor({"plus": make_tool(add)})
    ex = ToolExecutor({"plus": add, "aecho": make_tool(aecho)})
    assert sorted(ex.tools) == ["aecho", "plus"]
    assert [s["function"]["name"] for s in ex.schemas] == ["plus", "aecho"]


async def test_non_json_result_falls_back() -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    def point() -> Point:
        """A pydantic model result."""
        return Point(x=1, y=2)

    def opaque() -> Opaque:
        """Not JSON at all."""
        return Opaque()

    ex = ToolExecutor([make_tool(point), make_tool(opaque)])
    r1, r2 = await ex.run([call("point"), call("opaque", "call_1")], {})
    assert (r1.content, r2.content) == ('{"x":1,"y":2}', "<opaque>")


async def test_tool_error_kinds_and_tool_replies_are_recorded() -> None:
    from looprl.tools import ToolError, ToolReply

    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key.
        """
        if key == "down":
            raise ToolError("the backend is down", kind="backend_down", infra=True)
        if key == "missing":
            raise ToolError("no such key; try another", kind="not_found")
        return ToolReply(f"value of {key}", status="hit")  # type: ignore[return-value]

    ex = ToolExecutor([lookup])
    a, b, c = await ex.run([call("lookup", "c0", key="k"), call("lookup", "c1", key="missing"),
                            call("lookup", "c2", key="down")], {})  # fmt: skip
    ex.close()
    assert (a.content, a.error_kind, a.status) == ("value of k", None, "hit")
    assert (b.content, b.error_kind, b.infra) == (
        "Error: no such key; try another",
        "not_found",
        False,
    )
    assert (c.error_kind, c.infra) == ("backend_down", True)
    assert count_tool_errors([a, b, c]) == {"not_found": 1, "backend_down": 1}
    assert a.outcome().ok and a.outcome().status == "hit" and not b.outcome().ok
