"""verifiers v1 environments (tests/foreign/vf1_envs.py, the 0.4 API) through looprl's rollout.

The taskset runs in the verifiers v1 venv's worker; episodes are driven by a scripted engine on
the tiny model's tokenizer (token invariants checked), and the environment trains two steps.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
from helpers import check_token_invariants, run_episode, train_two_steps

from looprl.envs.foreign.verifiers_v1 import verifiers_v1_python
from looprl.envs.registry import load_environment

try:
    verifiers_v1_python()
except ValueError as exc:
    pytest.skip(f"{exc} (make setup-test makes it)", allow_module_level=True)

pytestmark = pytest.mark.slow  # each environment starts a worker that imports verifiers (~6 s)

HERE = Path(__file__).parent / "foreign"
V1 = f"verifiers-v1:{HERE / 'vf1_envs.py'}"
CALL = '<tool_call>{{"name": "calc_add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


@pytest.fixture(scope="module")
def env():
    env = load_environment(V1, num_tasks=3)
    yield env
    env.close()


def test_v1_taskset_toolsets_and_rubric_run_token_exact(env, tiny_tokenizer):
    task = env.get_tasks("train")[1]  # "What is 1 + 2?", answer 3
    assert [m.role for m in task.prompt] == ["system", "user"]
    assert task.prompt[1].content == "What is 1 + 2?"
    # the taskset's shared toolset (bare names) and the task's own (prefixed calc_)
    assert [s["function"]["name"] for s in env.tool_schemas] == ["hint", "calc_add"]
    script = [CALL.format(a=1, b=2), "The answer is 3."]
    episode = asyncio.run(run_episode(env, task, script, tiny_tokenizer))
    assert [m.role for m in episode.messages[2:]] == ["assistant", "tool", "assistant"]
    assert episode.messages[3].content == "3"  # setup_task ran (offset 0) before the call
    assert episode.rewards == {"exact_answer": 1.0, "used_tool": 1.0, "turns": 2.0}
    assert episode.reward == 1.5  # 1.0 x exact + 0.5 x used_tool; the metric weighs 0
    check_token_invariants(episode, env, tiny_tokenizer)


def test_v1_bad_argument_is_a_tool_error_and_a_stop_ends_the_episode(env, tiny_tokenizer):
    task = env.get_tasks("train")[0]
    script = [CALL.format(a='"one"', b=2), CALL.format(a=0, b=1) + " I give up", "never sent"]
    episode = asyncio.run(run_episode(env, task, script, tiny_tokenizer))
    assert sum(episode.tool_errors.values()) == 1, episode.tool_errors
    assert episode.num_turns == 2 and episode.stop_reason == "done"  # the task's @vf.stop
    assert episode.rewards["exact_answer"] == 0.0 and episode.rewards["used_tool"] == 1.0


@pytest.mark.parametrize(
    ("kind", "named"),
    [("stateful", "CountingToolset is a Toolset with a State subclass"),
     ("runtime", "RuntimeTask uses a reward or metric that needs `runtime`")],
)  # fmt: skip
def test_v1_parts_that_do_not_map_are_refused_in_one_line(kind, named):
    with pytest.raises(ValueError, match=named):
        load_environment(V1, kind=kind)


def test_v1_taskset_with_a_harness_of_its_own_is_refused():
    with pytest.raises(ValueError, match="exports OwnHarness, a taskset's own Harness or Env"):
        load_environment(f"verifiers-v1:{HERE / 'vf1_harness_env.py'}")


def test_v1_unknown_taskset_says_what_is_missing():
    with pytest.raises(ValueError, match="taskset 'no-such-taskset' not found"):
        load_environment("verifiers-v1:no-such-taskset")


@pytest.mark.slow
def test_v1_environment_trains_two_steps(tmp_path):
    rows = train_two_steps(tmp_path, V1, {"num_tasks": 4, "kind": "length", "max_turns": 2})
    assert len(rows) == 2 and all(math.isfinite(r["loss/total"]) for r in rows)
    assert any(r["reward/mean"] > 0 for r in rows)
