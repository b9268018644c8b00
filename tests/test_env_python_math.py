"""Tier 2: python_math with a scripted engine and the real sandbox; answer checking by math-verify."""

from __future__ import annotations

import json
import random

import pytest

from looprl.engines.base import GenerationRequest
from looprl.engines.scripted import ScriptedEngine
from looprl.envs.hints import with_hint
from looprl.envs.python_math import correct, final_answer, generate_tasks, load_environment
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import run_group
from looprl.sandbox.tool import format_result
from looprl.types import EpisodeResult, Message, Task


def call(code: str) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": "python_session", "arguments": {"code": code}})
        + "\n</tool_call>"
    )


async def one_episode(env, script, task: Task, tokenizer) -> EpisodeResult:
    """One episode of `task` played by a scripted engine; the env's sandbox closed after."""
    try:
        [ep] = await run_group(
            env,
            ScriptedEngine(script, tokenizer),
            task,
            1,
            renderer=Renderer(tokenizer, env.tool_schemas),
        )
    finally:
        await env.sandbox.close()
    return ep


def test_splits_disjoint_and_answers_exact():
    train = {t.prompt[0].content for t in generate_tasks("train", 300, 0)}
    evals = {t.prompt[0].content for t in generate_tasks("eval", 300, 0)}
    assert not train & evals
    frac = next(t for t in generate_tasks("train", 200, 1) if "fraction" in t.prompt[0].content)
    assert "/" in frac.answer or frac.answer.isdigit()


def _ep(answer: str, reply: str, tool_msgs: list[str] = ()) -> EpisodeResult:
    task = Task(id="t", prompt=[Message(role="user", content="q")], answer=answer)
    msgs = [
        *task.prompt,
        *(Message(role="tool", content=c, name="python_session") for c in tool_msgs),
    ]
    return EpisodeResult(task=task, messages=[*msgs, Message(role="assistant", content=reply)])


def test_answer_equivalence_by_math_verify():
    assert correct(_ep("3/4", "So \\boxed{0.75}")) == 1.0
    assert correct(_ep("3/4", "The answer is 6/8.")) == 1.0
    assert correct(_ep("3/4", "\\boxed{0.7}")) == 0.0
    assert correct(_ep("3/4", "no idea")) == 0.0
    assert final_answer(_ep("1", "\\boxed{\\frac{1}{2}}")) == "\\frac{1}{2}"


def test_sandbox_failure_is_not_the_models_fault():
    with pytest.raises(RuntimeError, match="sandbox_error"):
        correct(_ep("1", "\\boxed{1}", ["status: sandbox_error\nmessage: worker died"]))


async def test_session_episode_persists_variables_and_scores(tiny_tokenizer):
    env = load_environment()
    task = env.get_tasks("eval", 1, seed=0)[0]
    answer = task.answer

    def script(req: GenerationRequest) -> str:
        tools = [m for m in req.messages if m.role == "tool"]
        if not tools:
            return call(f"x = {json.dumps(answer)}")
        if len(tools) == 1:
            return call("print(x)")
        if len(tools) == 2:
            return call("1/0")
        return f"The result is \\boxed{{{tools[1].content.split('stdout:')[1].strip()}}}"

    ep = await one_episode(env, script, task, tiny_tokenizer)
    tool_msgs = [m.content for m in ep.messages if m.role == "tool"]
    assert tool_msgs[0].startswith("status: ok") and answer in tool_msgs[1]
    assert tool_msgs[2].startswith("status: error") and "ZeroDivisionError" in tool_msgs[2]
    assert ep.rewards == {"correct": 1.0, "used_python": 1.0, "code_errors": 1.0} and not ep.errors
    assert "session_id" not in json.dumps(env.tool_schemas)


async def test_call_hint_is_the_sandboxs_own_reply_to_the_tasks_code():
    """The hinted call's reply is what the real sandbox prints for the task's code, on every
    kind of generated problem, and the code's output is the task's answer."""
    env = load_environment(session=False)
    tasks = generate_tasks("train", 40, 3)
    for kind in ("pens", "remainder", "squares", "reduced fraction", "team"):  # the 5 templates
        assert any(kind in t.prompt[0].content for t in tasks), kind
    try:
        for task in tasks:
            hint = env.hint(task, random.Random(0))
            assert hint is not None and hint.kind == "tool_call"
            asked, reply = hint.messages
            [call_] = asked.tool_calls
            assert call_.name == "python"
            ran = await env.sandbox.execute(call_.arguments["code"])
            assert reply.content == format_result(ran), task.prompt[0].content
            assert ran.stdout.strip() == task.answer
    finally:
        await env.sandbox.close()


async def test_hinted_episode_credits_the_answer_not_the_call(tiny_tokenizer):
    """A model that only boxes the hinted result is correct, but did not use python itself."""
    env = load_environment()
    task = env.get_tasks("train", 1, seed=0)[0]
    hinted = with_hint(task, env.hint(task, random.Random(0)))

    def script(req: GenerationRequest) -> str:
        shown = [m for m in req.messages if m.role == "tool"][-1].content
        return f"\\boxed{{{shown.split('stdout:')[1].strip()}}}"

    ep = await one_episode(env, script, hinted, tiny_tokenizer)
    assert ep.rewards["correct"] == 1.0 and ep.rewards["used_python"] == 0.0


def test_answer_hint_and_a_bad_hint_style():
    task = generate_tasks("train", 1, 0)[0]
    note = load_environment(hint_style="answer").hint(task, random.Random(0))
    assert note is not None and note.kind == "note"
    assert note.messages[0].content.endswith(f"\\boxed{{{task.answer}}}.")
    with pytest.raises(ValueError, match="hint_style='teacher'.*'answer', 'call', 'call_answer'"):
        load_environment(hint_style="teacher")
    own = Task(id="mine", prompt=[Message(role="user", content="q")], answer="1")
    assert load_environment().hint(own, random.Random(0)) is None  # no code: no call hint


def test_call_answer_hint_is_the_call_then_a_note():
    task = generate_tasks("train", 1, 0)[0]
    hint = load_environment(hint_style="call_answer").hint(task, random.Random(0))
    assert hint is not None and hint.kind == "tool_call+note"
    call_, reply, note = hint.messages
    assert call_.tool_calls[0].name == "python_session" and reply.role == "tool"
    assert note.role == "user" and note.content.endswith(f"\\boxed{{{task.answer}}}.")
