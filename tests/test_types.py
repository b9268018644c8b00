"""Tier 1: records round-trip through JSON without loss."""

from __future__ import annotations

import json

import pytest

from looprl.types import EpisodeResult, Message, Task, ToolCall, Trajectory


def _episode() -> EpisodeResult:
    task = Task(
        id="t1",
        prompt=[Message(role="user", content="What is 2+2?")],
        answer="4",
        info={"k": [1, 2]},
        env="calc",
    )
    traj = Trajectory()
    traj.extend([1, 2, 3], sampled=False, turn=0)
    traj.extend([4, 5], sampled=True, turn=0, logprobs=[-0.25, -1.5])
    msgs = [
        *task.prompt,
        Message(
            role="assistant",
            content="",
            tool_calls=[
                ToolCall("calculate", {"expression": "2+2"}, "call_0", "<tool_call>..</tool_call>")
            ],
            raw="raw",
        ),
        Message(role="tool", content="4", tool_call_id="call_0", name="calculate"),
    ]
    return EpisodeResult(
        task=task, messages=msgs, trajectories=[traj], reward=1.0, rewards={"correct": 1.0}, metrics={"m": 0.5},
        errors=[{"kind": "scoring", "function": "f", "message": "boom"}], tool_errors={"timeout": 1},
        num_turns=2, num_tool_calls=1, truncated=False, stop_reason="done", timings={"total": 0.1}, rollout_index=3,
        state={"ok": 1, "handle": object()},
    )  # fmt: skip


def test_episode_roundtrip_is_lossless():
    ep = _episode()
    back = EpisodeResult.from_json(ep.to_json())
    assert back.to_dict() == json.loads(ep.to_json())
    assert back.trajectories[0].logprobs == [0.0, 0.0, 0.0, -0.25, -1.5]
    assert back.messages[1].tool_calls[0].arguments == {"expression": "2+2"}
    assert back.state["ok"] == 1 and isinstance(back.state["handle"], str)  # handles become repr


def test_trajectory_extend_and_check():
    traj = Trajectory()
    traj.extend([1, 2], sampled=False, turn=0)
    traj.extend([3], sampled=True, turn=0, logprobs=[-0.1])
    assert traj.mask == [0, 0, 1] and traj.num_sampled == 1
    traj.check()
    with pytest.raises(ValueError, match="one logprob each"):
        traj.extend([4, 5], sampled=True, turn=1, logprobs=[-0.1])
    traj.logprobs[0] = -1.0
    with pytest.raises(ValueError, match="mask 0"):
        traj.check()


def test_message_from_openai_format():
    m = Message.from_dict(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
            ],
        }
    )
    assert m.tool_calls[0].arguments == {"x": 1} and m.content == ""
    assert Task.from_dict({"id": 3, "prompt": "hi"}).prompt[0].content == "hi"


def test_trainable_flags():
    ep = _episode()
    assert ep.scoring_error and not ep.rollout_error and not ep.trainable
