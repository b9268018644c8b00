"""Foreign environments: verifiers and OpenEnv ones run through looprl's rollout and trainer.

The environments are written in the foreign APIs (tests/foreign/); episodes are driven by a
scripted engine on the tiny model's tokenizer (token invariants checked), and each kind trains
two steps on the tiny model.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from helpers import check_token_invariants, run_episode, train_two_steps

from looprl.engines.scripted import ScriptedEngine
from looprl.envs.registry import load_environment
from looprl.rollout.loop import episode_seed, run_group

pytest.importorskip("verifiers", reason="make setup-test installs the verifiers extra")
pytest.importorskip("openenv", reason="make setup-test installs the openenv extra")

HERE = Path(__file__).parent / "foreign"
VF = f"verifiers:{HERE / 'vf_envs.py'}"
OE = f"openenv:{HERE / 'openenv_envs.py'}"
CALL = '<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def test_verifiers_tool_env_runs_its_tools_and_rubric_token_exact(tiny_tokenizer):
    env = load_environment(VF, kind="tool")
    task = env.get_tasks("train", n=2)[1]  # "What is 1 + 2?", answer 3
    assert [m.role for m in task.prompt] == ["system", "user"] and task.answer == "3"
    assert [s["function"]["name"] for s in env.tool_schemas] == ["add"]
    assert env.limits.max_turns == 3  # the ToolEnv's max_turns
    script = [CALL.format(a=1, b=2), "The answer is 3."]
    episode = asyncio.run(run_episode(env, task, script, tiny_tokenizer))
    assert [m.role for m in episode.messages[2:]] == ["assistant", "tool", "assistant"]
    assert episode.messages[3].content == "3"
    # verifiers' own reward and its ToolEnv / MultiTurnEnv monitor metrics (weight 0)
    assert episode.rewards == {
        "exact_answer": 1.0, "num_turns": 2.0, "total_tool_calls": 1.0, "add_calls": 1.0,
    }  # fmt: skip
    assert episode.reward == 1.0
    check_token_invariants(episode, env, tiny_tokenizer)


def test_verifiers_bad_tool_call_is_a_counted_tool_error_the_model_reads(tiny_tokenizer):
    env = load_environment(VF, kind="tool")
    task = env.get_tasks("train", n=1)[0]
    script = [CALL.format(a='"one"', b=2), "The answer is 1."]
    episode = asyncio.run(run_episode(env, task, script, tiny_tokenizer))
    assert sum(episode.tool_errors.values()) == 1, episode.tool_errors
    assert episode.messages[3].role == "tool" and "a" in episode.messages[3].content
    assert episode.rewards["exact_answer"] == 1.0 and not episode.errors


def test_verifiers_env_response_stop_conditions_and_final_response(tiny_tokenizer):
    env = load_environment(VF, kind="game")
    task = env.get_tasks("train", n=1)[0]  # secret 3
    won = asyncio.run(run_episode(env, task, ["1", "3"], tiny_tokenizer))
    assert [m.content for m in won.messages[1:]] == ["1", "1 is wrong, go higher.", "3"]
    # the final_env_response ("Correct!") reaches the rubric's completion, not the model
    assert won.rewards["guessed"] == 1.0 and won.rewards["feedback_turns"] == 2.0
    check_token_invariants(won, env, tiny_tokenizer)
    lost = asyncio.run(run_episode(env, task, ["5", "6", "7", "8"], tiny_tokenizer))
    # the game's own @vf.stop (two wrong guesses answered) ends it before max_turns=4
    assert lost.num_turns == 3 and lost.stop_reason == "done"
    assert lost.rewards["guessed"] == 0.0 and lost.rewards["num_turns"] == 3.0


def test_verifiers_group_reward_sees_the_whole_group(tiny_tokenizer):
    env = load_environment(VF, kind="game")
    task = env.get_tasks("train", n=1)[0]
    # rollout 0 guesses "3" at once, rollout 1 first guesses "1": their completions differ
    first = {episode_seed(0, task.id, 0, turn) for turn in range(4)}

    def reply(request):
        turn = sum(m.role == "assistant" for m in request.messages)
        return ["3"][turn] if request.sampling.seed in first else ["1", "3"][turn]

    episodes = asyncio.run(run_group(env, ScriptedEngine(reply), task, 2, renderer=None))
    assert [ep.num_turns for ep in episodes] == [1, 2]
    assert [ep.rewards["group_rank"] for ep in episodes] == [0.0, 1.0]  # the longer one
    assert [ep.reward for ep in episodes] == [1.0, 1.5]  # guessed (1.0) + 0.5 x rank


def test_verifiers_text_prompt_column_is_one_user_turn(tiny_tokenizer):
    env = load_environment(VF, kind="text_prompt")
    task = env.get_tasks("train", n=2)[1]
    assert [(m.role, m.content) for m in task.prompt] == [("user", "What is 1 + 1?")]
    episode = asyncio.run(run_episode(env, task, ["Two."], tiny_tokenizer))
    assert episode.rewards == {"reply_length": 0.04, "num_turns": 1.0}
    check_token_invariants(episode, env, tiny_tokenizer)


def test_verifiers_raising_reward_is_a_scoring_error_not_a_zero(tiny_tokenizer):
    env = load_environment(VF, kind="raising")
    task = env.get_tasks("train", n=1)[0]
    episode = asyncio.run(run_episode(env, task, ["The answer is 1."], tiny_tokenizer))
    assert "broken" not in episode.rewards
    assert episode.errors == [
        {"kind": "scoring", "function": "broken", "message": "RuntimeError: broken reward"}
    ]


@pytest.mark.parametrize(
    ("kind", "named"),
    [("stateful", "StatefulToolEnv"), ("completion", "message_type='completion'")],
)
def test_verifiers_parts_that_do_not_map_are_refused_by_name(kind, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        load_environment(VF, kind=kind)


def test_foreign_names_without_a_module_or_with_a_bad_one_say_what_to_write():
    with pytest.raises(ValueError, match="write verifiers:MODULE"):
        load_environment("verifiers:")
    with pytest.raises(ValueError, match="cannot import 'no_such_env_module'"):
        load_environment("openenv:no_such_env_module")
    with pytest.raises(ValueError, match="defines 3 OpenEnv Environment classes"):
        load_environment(OE)


def test_openenv_steps_rewards_and_observations_token_exact(tiny_tokenizer):
    env = load_environment(f"{OE}:EchoLength", num_train_tasks=3, max_steps=2)
    tasks = env.get_tasks("train")
    assert [t.id for t in tasks] == ["seed-0", "seed-1", "seed-2"]
    assert tasks[0].prompt[-1].content.startswith("Say something about ")
    episode = asyncio.run(run_episode(env, tasks[0], ["hello there", "bye"], tiny_tokenizer))
    assert [m.content for m in episode.messages[1:]] == [
        "hello there",
        "You said: hello there",
        "bye",
    ]
    assert episode.rewards == {
        "openenv_return": 0.11 + 0.03,
        "openenv_steps": 2.0,
        "openenv_done": 1.0,
    }
    assert episode.state["openenv_state"]["step_count"] == 2
    check_token_invariants(episode, env, tiny_tokenizer)


def test_openenv_invalid_action_is_answered_and_the_episode_goes_on(tiny_tokenizer):
    env = load_environment(f"{OE}:Countdown", num_train_tasks=3)
    task = env.get_tasks("train")[2]  # target 2
    assert json.loads(task.prompt[-1].content) == {"target": 2, "last": ""}
    episode = asyncio.run(run_episode(env, task, ["two", "1", "2"], tiny_tokenizer))
    assert episode.messages[2].content.startswith("Invalid action (number: String should match")
    assert episode.rewards["openenv_return"] == 1.0 and episode.rewards["openenv_steps"] == 2.0


def test_openenv_without_concurrent_sessions_runs_one_episode_at_a_time():
    env = load_environment(f"{OE}:Serial", num_train_tasks=1, max_steps=1)
    engine = ScriptedEngine(["hi"], delay=0.01)
    episodes = asyncio.run(run_group(env, engine, env.get_tasks("train")[0], 3, renderer=None))
    assert all(not ep.errors for ep in episodes)
    assert env.cls.most == 1 and env.cls.live == 0  # the class counts its live sessions


def test_openenv_refuses_an_action_it_cannot_fill_from_text():
    from openenv.core.env_server.types import Action

    from looprl.envs.foreign.openenv import pick_action_field

    class Move(Action):
        x: int
        y: int

    with pytest.raises(ValueError, match=r"required fields \['x', 'y'\].*action_field"):
        pick_action_field(Move, None)
    with pytest.raises(ValueError, match="must be a str field"):
        pick_action_field(Move, "x")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env_name", "env_kwargs"),
    [(VF, {"kind": "single"}), (f"{OE}:EchoLength", {"max_steps": 1, "max_tokens_per_turn": 96})],
    ids=["verifiers", "openenv"],
)
def test_two_training_steps_on_a_foreign_environment(tmp_path, env_name, env_kwargs):
    rows = train_two_steps(tmp_path, env_name, env_kwargs)
    assert len(rows) == 2 and all(math.isfinite(r["loss/total"]) for r in rows)
    assert any(r.get("train/adv_abs_mean", 0.0) > 0 for r in rows)
    assert any(r["reward/mean"] > 0 for r in rows)
