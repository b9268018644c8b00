"""Tier 2: scripted-engine rollouts: exact messages, masks, decoding, errors and limits."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest

from looprl.engines.base import GenerationRequest
from looprl.engines.scripted import ScriptedEngine
from looprl.envs.base import Limits
from looprl.envs.calculator import load_environment
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import rollout, run_group
from looprl.types import EpisodeResult


def call_text(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def solver(request: GenerationRequest) -> str:
    """A perfect calculator policy: call the tool, then copy its result."""
    tool_msgs = [m for m in request.messages if m.role == "tool"]
    if not tool_msgs:
        expr = request.messages[-1].content.removeprefix("What is ").removesuffix("?")
        return call_text("calculate", {"expression": expr})
    return f"The answer is {tool_msgs[-1].content}."


@pytest.fixture
def env():
    return load_environment()


def _sampled_runs(ep: EpisodeResult) -> list[list[int]]:
    """Maximal runs of mask-1 tokens in the first segment."""
    runs, cur = [], []
    seg = ep.trajectories[0]
    for tok, m in zip(seg.token_ids, seg.mask, strict=True):
        if m:
            cur.append(tok)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


async def test_tool_episode_messages_masks_and_decoding(env, tiny_tokenizer):
    engine = ScriptedEngine(solver, tiny_tokenizer)
    renderer = Renderer(tiny_tokenizer, env.tool_schemas)
    task = env.get_tasks("eval", 1, seed=3)[0]
    [ep] = await run_group(env, engine, task, 1, renderer=renderer)
    roles = [m.role for m in ep.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert ep.messages[2].tool_calls[0].arguments == {"expression": task.info["expression"]}
    assert ep.messages[3].content == task.answer
    assert ep.reward == 1.0 and ep.rewards["used_tool"] == 1.0 and ep.stop_reason == "done"
    assert ep.num_turns == 2 and ep.num_tool_calls == 1 and not ep.tool_errors
    seg = ep.trajectories[0]
    seg.check()
    # mask 1 exactly on what the engine sampled, turn by turn; everything else (prompt, tool output, glue) is 0
    expected = [tiny_tokenizer.encode(solver_text, add_special_tokens=False) + tiny_tokenizer.encode("<|im_end|>", add_special_tokens=False)
                for solver_text in (ep.messages[2].raw, ep.messages[4].raw)]  # fmt: skip
    assert _sampled_runs(ep) == expected
    assert all(lp == -0.5 for lp, m in zip(seg.logprobs, seg.mask, strict=True) if m)
    # decoding the flat trajectory reproduces the conversation as the template renders it
    full = renderer.render_text(ep.messages, add_generation_prompt=False)
    assert tiny_tokenizer.decode(seg.token_ids) + "\n" == full
    # tool output tokens are attended but not trained
    tool_ids = tiny_tokenizer.encode(task.answer, add_special_tokens=False)
    n = len(tool_ids)
    starts = [
        i
        for i in range(len(seg.token_ids) - n)
        if seg.token_ids[i : i + n] == tool_ids and seg.turns[i] == 1
    ]
    assert starts and all(seg.mask[i] == 0 for i in range(starts[0], starts[0] + n))
    assert ep.metrics["template_breaks"] == 0


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("<tool_call>\n{not json}\n</tool_call>", "malformed_json"),
        (
            "<tool_call>\n" + json.dumps({"arguments": {"expression": "1+1"}}) + "\n</tool_call>",
            "malformed_json",
        ),
        (call_text("calculator", {"expression": "1+1"}), "unknown_tool"),
        (call_text("calculate", {}), "missing_argument"),
        (call_text("calculate", {"expression": "1+1", "x": 2}), "unexpected_argument"),
        (call_text("calculate", {"expression": "import os"}), "exception"),
        (
            "<tool_call>\n" + json.dumps({"name": "calculate", "arguments": {"expression": "1"}}),
            "malformed_json",
        ),
    ],
)
async def test_bad_calls_become_tool_messages_and_counts(env, tiny_tokenizer, reply, kind):
    engine = ScriptedEngine([reply, "The answer is 0."], tiny_tokenizer)
    task = env.get_tasks("eval", 1)[0]
    [ep] = await run_group(
        env, engine, task, 1, renderer=Renderer(tiny_tokenizer, env.tool_schemas)
    )
    assert ep.tool_errors == {kind: 1}
    tool_msg = ep.messages[3]
    assert tool_msg.role == "tool" and tool_msg.content.startswith("Error")
    assert (
        ep.rewards["tool_call_validity"] == 0.0 and not ep.errors
    )  # a bad call is learning signal, not an error


async def test_max_turns_truncates(tiny_tokenizer):
    env = load_environment(max_turns=2)
    engine = ScriptedEngine(
        lambda req: call_text("calculate", {"expression": "2*3"}), tiny_tokenizer
    )
    ep = await rollout(
        env,
        engine,
        env.get_tasks("eval", 1)[0],
        renderer=Renderer(tiny_tokenizer, env.tool_schemas),
    )
    assert ep.stop_reason == "max_turns" and ep.truncated and ep.num_turns == 2


async def test_max_tokens_per_turn_truncates(tiny_tokenizer):
    env = load_environment(max_tokens_per_turn=5)
    engine = ScriptedEngine(lambda req: "The answer is " + "9" * 50, tiny_tokenizer)
    ep = await rollout(
        env,
        engine,
        env.get_tasks("eval", 1)[0],
        renderer=Renderer(tiny_tokenizer, env.tool_schemas),
    )
    assert ep.stop_reason == "max_tokens" and ep.truncated and ep.trajectories[0].num_sampled == 5


async def test_max_context_truncates(tiny_tokenizer):
    env = load_environment(max_context_tokens=260, max_turns=10)
    engine = ScriptedEngine(
        lambda req: call_text("calculate", {"expression": "2*3"}), tiny_tokenizer
    )
    ep = await rollout(
        env,
        engine,
        env.get_tasks("eval", 1)[0],
        renderer=Renderer(tiny_tokenizer, env.tool_schemas),
    )
    assert ep.stop_reason == "max_context" and len(ep.trajectories[0]) <= 260


async def test_engine_failure_marks_only_that_episode(env, tiny_tokenizer):
    calls = {"n": 0}

    def flaky(req: GenerationRequest) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("server went away")
        return solver(req)

    engine = ScriptedEngine(flaky, tiny_tokenizer)
    task = env.get_tasks("eval", 1)[0]
    eps = await run_group(env, engine, task, 3, renderer=Renderer(tiny_tokenizer, env.tool_schemas))
    errored = [ep for ep in eps if ep.rollout_error]
    assert len(errored) == 1 and "server went away" in errored[0].errors[0]["message"]
    assert all(ep.reward == 1.0 for ep in eps if not ep.rollout_error)


async def test_a_slow_environment_times_out_and_keeps_the_partial_episode(tiny_tokenizer):
    env = load_environment()
    env.limits = Limits(max_turns=4, max_tokens_per_turn=96, max_context_tokens=1024, timeout_s=0.2)
    real_step = env.step

    async def slow_step(messages, parsed, state):
        await asyncio.sleep(0.15)  # two turns of this pass the 0.2 s budget
        return await real_step(messages, parsed, state)

    env.step = slow_step
    task = env.get_tasks("eval", 1)[0]
    renderer = Renderer(tiny_tokenizer, env.tool_schemas)
    ep = await rollout(env, ScriptedEngine(solver, tiny_tokenizer), task, renderer=renderer)
    assert ep.stop_reason == "timeout" and ep.rollout_error and ep.num_turns == 2
    assert "environment" in ep.errors[0]["message"] and "0.2 s" in ep.errors[0]["message"]


async def test_waiting_for_the_model_does_not_count_towards_the_timeout(tiny_tokenizer):
    """A loaded engine queues requests: a slow model is not a hung environment."""
    env = load_environment()
    env.limits = Limits(max_turns=4, max_tokens_per_turn=96, max_context_tokens=1024, timeout_s=0.2)
    engine = ScriptedEngine(solver, tiny_tokenizer, delay=0.15)  # 0.3 s of generation in all
    task = env.get_tasks("eval", 1)[0]
    ep = await rollout(env, engine, task, renderer=Renderer(tiny_tokenizer, env.tool_schemas))
    assert ep.stop_reason == "done" and not ep.errors and ep.num_turns == 2


async def test_environment_exception_is_a_rollout_error(env, tiny_tokenizer):
    async def broken_step(messages, parsed, state):
        raise RuntimeError("env bug")

    env.step = broken_step
    ep = await rollout(
        env,
        ScriptedEngine(solver, tiny_tokenizer),
        env.get_tasks("eval", 1)[0],
        renderer=Renderer(tiny_tokenizer, env.tool_schemas),
    )
    assert ep.rollout_error and "env bug" in ep.errors[0]["message"]


async def test_template_break_starts_a_new_segment(env, tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    # a template that rewrites history: the system line depends on the conversation length
    tok.chat_template = (
        "{{ '<|im_start|>system\\nturns ' ~ (messages|length) ~ '<|im_end|>\\n' }}"
        + tok.chat_template
    )
    renderer = Renderer(tok, env.tool_schemas)
    task = env.get_tasks("eval", 1)[0]
    [ep] = await run_group(env, ScriptedEngine(solver, tok), task, 1, renderer=renderer)
    assert ep.reward == 1.0
    assert len(ep.trajectories) == 2 and ep.metrics["template_breaks"] == 1
    second = ep.trajectories[1]
    assert second.num_sampled > 0 and second.mask[0] == 0
    assert tok.decode(second.token_ids).startswith("<|im_start|>system\nturns 4")


async def test_message_level_engine_has_no_tokens(env):
    engine = ScriptedEngine(solver)  # no tokenizer: message-level, like a hosted API
    [ep] = await run_group(env, engine, env.get_tasks("eval", 1)[0], 1, renderer=None)
    assert ep.reward == 1.0 and ep.trajectories[0].token_ids == []


async def test_tool_outcomes_are_recorded_on_the_episode(env, tiny_tokenizer):
    engine = ScriptedEngine(solver, tiny_tokenizer)
    task = env.get_tasks("eval", 1, seed=3)[0]
    [ep] = await run_group(env, engine, task, 1, renderer=Renderer(tiny_tokenizer))
    [outcome] = ep.tool_outcomes
    assert (outcome.name, outcome.call_id, outcome.ok, outcome.infra) == (
        "calculate",
        "call_0",
        True,
        False,
    )
    assert EpisodeResult.from_json(ep.to_json()).tool_outcomes == ep.tool_outcomes


class VersionedEngine(ScriptedEngine):
    """The scripted solver as a trainable engine at `policy_version` 3; with `per_token` it
    reports each token's version itself (7), as an engine with in-flight updates does."""

    def __init__(self, tokenizer, *, per_token: bool) -> None:
        super().__init__(solver, tokenizer)
        self.policy_version = 3
        self.per_token = per_token

    def sync_weights(self, weights, *, version=None) -> None:
        self.policy_version = version

    async def generate(self, request: GenerationRequest):
        gen = await super().generate(request)
        if self.per_token:
            gen.versions = [7] * len(gen.token_ids)
        return gen


@pytest.mark.parametrize(
    ("engine_kind", "sampled_version"), [("scripted", -1), ("trainable", 3), ("per_token", 7)]
)
async def test_sampled_tokens_record_their_policy_version(
    env, tiny_tokenizer, engine_kind, sampled_version
):
    engine = (
        ScriptedEngine(solver, tiny_tokenizer)
        if engine_kind == "scripted"
        else VersionedEngine(tiny_tokenizer, per_token=engine_kind == "per_token")
    )
    task = env.get_tasks("eval", 1, seed=3)[0]
    [ep] = await run_group(
        env, engine, task, 1, renderer=Renderer(tiny_tokenizer, env.tool_schemas)
    )
    seg = ep.trajectories[0]
    seg.check()
    assert ep.num_turns == 2 and seg.num_sampled > 0
    assert seg.versions == [sampled_version if m else -1 for m in seg.mask]
