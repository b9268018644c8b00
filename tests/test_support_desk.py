"""Tools with a simulated user: the support desk and `ToolEnv(user=...)`, driven by scripted engines.

Asserts the turns alternate (user replies between tool turns), every user message is masked out
of the token-exact trajectory, concurrent episodes of one task keep their own orders, the rubric
tells a resolved case from one outside the policy, and a model-driven user sees the conversation
from its side and never puts its tokens in the policy's trajectory.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers import LOGPROB, check_token_invariants

from looprl.engines.scripted import ScriptedEngine
from looprl.envs.base import Limits, ToolEnv
from looprl.envs.registry import load_environment
from looprl.envs.support_desk import allowed
from looprl.envs.user import END_MARKER, ModelUser, as_user
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import rollout, run_group
from looprl.rubrics import Rubric
from looprl.sft.teachers import support_desk, tool_call
from looprl.types import EpisodeResult, Message, Task


@pytest.fixture(scope="module")
def desk():
    """The bundled support desk (its MCP policy server started once for the module)."""
    env = load_environment("support_desk")
    yield env
    env.close()


def _task(env, kind: str, ok: bool) -> Task:
    """The first eval task of a kind whose action the policy allows (`ok`) or forbids."""
    for task in env.get_tasks("eval", 60):
        target = task.info["orders"][0]
        if task.info["kind"] == kind and allowed(kind, target) == ok:
            return task
    raise AssertionError(f"no {kind} task with allowed={ok} among 60")


async def _play(env, task: Task, policy, tokenizer=None) -> EpisodeResult:
    engine = ScriptedEngine(lambda request: policy(request.messages), tokenizer, logprob=LOGPROB)
    renderer = Renderer(tokenizer, env.tool_schemas) if tokenizer is not None else None
    episode = await rollout(env, engine, task, renderer=renderer)
    await env.rubric.score(episode)
    return episode


def test_user_and_tool_turns_alternate_token_exact(desk, tiny_tokenizer):
    task = _task(desk, "refund", ok=True)
    episode = asyncio.run(_play(desk, task, support_desk, tiny_tokenizer))
    roles = [m.role for m in episode.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "tool", "assistant",
                     "tool", "assistant", "tool", "assistant"]  # fmt: skip
    assert episode.messages[3].content == f"My order number is {task.info['order_id']}."
    assert episode.stop_reason == "done" and episode.num_turns == 5
    check_token_invariants(episode, desk, tiny_tokenizer)  # the user reply is masked out
    assert episode.rewards["resolved"] == 1.0 and episode.rewards["policy_violation"] == 0.0
    assert [o.name for o in episode.tool_outcomes] == ["lookup_order", "refund_policy", "refund"]


def test_concurrent_episodes_keep_their_own_orders(desk):
    task = _task(desk, "refund", ok=True)
    engine = ScriptedEngine(lambda request: support_desk(request.messages))
    episodes = asyncio.run(run_group(desk, engine, task, 4, renderer=None))
    for ep in episodes:  # a shared database would answer the later refunds "already refunded"
        assert ep.tool_outcomes[-1].ok and ep.reward == 1.0
        assert ep.state["db"][task.info["order_id"]]["refunded"] is True
    assert len({id(ep.state["db"]) for ep in episodes}) == 4
    assert not any(o["refunded"] for o in task.info["orders"])  # the task itself is untouched


def _refund_anyway(messages: list[Message]) -> str:
    """The teacher, except that it refunds once it has read the policy, whatever it says."""
    if any(m.role == "tool" and m.name == "refund_policy" for m in messages):
        if not any(m.role == "tool" and m.name == "refund" for m in messages):
            order = json.loads(next(m.content for m in messages if m.name == "lookup_order"))
            return tool_call("refund", {"order_id": order["order_id"]})
        return "Refunded."
    return support_desk(messages)


@pytest.mark.parametrize(
    ("kind", "ok", "policy", "resolved", "violations"),
    [
        ("refund", False, support_desk, 1.0, 0.0),  # declined after checking: right
        ("refund", False, _refund_anyway, 0.0, 1.0),  # refunded outside the policy
        ("refund", False, lambda m: "Sorry, no refund.", 0.0, 0.0),  # declined without checking
        ("address", True, support_desk, 1.0, 0.0),
        ("address", False, support_desk, 1.0, 0.0),
        ("status", True, support_desk, 1.0, 0.0),
        ("status", True, lambda m: "It is on its way.", 0.0, 0.0),
    ],
)
def test_rubric_reads_the_database_and_the_policy(desk, kind, ok, policy, resolved, violations):
    episode = asyncio.run(_play(desk, _task(desk, kind, ok), policy))
    assert episode.rewards["resolved"] == resolved
    assert episode.rewards["policy_violation"] == violations


def test_a_model_user_sees_its_side_and_stays_out_of_the_trajectory(tiny_tokenizer):
    seen: list[list[Message]] = []

    def user_model(request) -> str:
        seen.append(request.messages)
        return "It is order A1234." if len(seen) == 1 else f"Thanks. {END_MARKER}"

    persona = "You are a customer; your order is {order_id}. End with " + END_MARKER
    env = ToolEnv(
        name="desk", rubric=Rubric([lambda ep: 0.0]), limits=Limits(max_turns=4),
        user=ModelUser(ScriptedEngine(user_model), persona),
    )  # fmt: skip
    task = Task("t", [Message(role="user", content="Help me.")], None, {"order_id": "A1234"})
    policy = ScriptedEngine(["Which order?", "Found it."], tiny_tokenizer, logprob=LOGPROB)
    renderer = Renderer(tiny_tokenizer, env.tool_schemas)
    episode = asyncio.run(rollout(env, policy, task, renderer=renderer))
    assert [m.role for m in episode.messages] == ["user", "assistant", "user", "assistant"]
    assert episode.messages[2].content == "It is order A1234." and episode.stop_reason == "done"
    first = [(m.role, m.content) for m in seen[0]]
    assert first == [("system", persona.format(order_id="A1234")),
                     ("user", "(Start the conversation.)"), ("assistant", "Help me."),
                     ("user", "Which order?")]  # fmt: skip
    check_token_invariants(episode, env, tiny_tokenizer)  # mask 1 only on the policy's tokens


def test_bad_users_are_refused_with_the_fix(tiny_tokenizer):
    with pytest.raises(ValueError, match="user must be a function"):
        as_user(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pass the model's tokenizer \(ModelUser"):
        ModelUser(ScriptedEngine(["hi"], tiny_tokenizer), "persona")
    user = ModelUser(ScriptedEngine(["hi"]), "Your order is {order_id}.")
    with pytest.raises(ValueError, match=r"names \{order_id\}, which task 't' lacks"):
        user.conversation([], Task("t", [], None, {}))
    with pytest.raises(ValueError, match="user must be 'scripted' or a table"):
        load_environment("support_desk", user="robot")


def test_a_scripted_user_may_be_async():
    async def user(messages, task):
        return None

    assert asyncio.run(as_user(user).reply([], Task("t", [], None))) is None  # type: ignore[union-attr]


def test_the_docs_user_tutorial_runs_as_written():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "environments.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "def customer(" in b]
    namespace: dict = {}
    exec(compile(block, "docs/environments.md", "exec"), namespace)  # builds, connects to nothing
    env, task = (
        namespace["env"],
        Task("t", [Message(role="user", content="Hi")], None, {"order_id": "A1"}),
    )
    script = ["Which order?", tool_call("lookup_order", {"order_id": "A1"}), "It has shipped."]
    episode = asyncio.run(rollout(env, ScriptedEngine(script), task, renderer=None))
    roles = [m.role for m in episode.messages]
    assert roles == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert isinstance(namespace["model_customer"], ModelUser)


def test_a_model_user_names_what_its_model_needs():
    with pytest.raises(ValueError, match="kind must be 'openai' or 'torch', got 'vllm'"):
        ModelUser.from_model("vllm", "m", "persona")
    with pytest.raises(ValueError, match="needs base_url"):
        ModelUser.from_model("openai", "m", "persona")
