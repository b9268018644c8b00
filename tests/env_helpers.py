"""Shared checks for environment tests: run a scripted episode and assert the token invariants."""

from __future__ import annotations

from typing import Any

from looprl.engines.scripted import ScriptedEngine
from looprl.envs.base import Environment
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import rollout
from looprl.types import EpisodeResult, Message, Task

LOGPROB = -0.5


async def run_episode(
    env: Environment, task: Task, script: list[str], tokenizer: Any | None = None
) -> EpisodeResult:
    """One scripted rollout of `task`, scored by the rubric of the environment that runs it."""
    engine = ScriptedEngine(script, tokenizer, logprob=LOGPROB)
    renderer = Renderer(tokenizer, env.tool_schemas) if tokenizer is not None else None
    episode = await rollout(env, engine, task, renderer=renderer)
    if not episode.rollout_error:
        await env.for_task(task).rubric.score(episode)
    return episode


def check_token_invariants(episode: EpisodeResult, env: Environment, tokenizer: Any) -> None:
    """Mask 1 exactly on sampled tokens, 0 elsewhere, and the tokens decode to the conversation.

    Decoding the trajectory must give the chat template's rendering of the conversation in which
    each assistant message is the raw text the model sampled (the template's closing newline after
    the last turn is the only difference).
    """
    assert not episode.errors, episode.errors
    assert len(episode.trajectories) == 1, "no template break is expected with the tiny template"
    traj = episode.trajectories[0]
    traj.check()
    renderer = Renderer(tokenizer, env.for_task(episode.task).tool_schemas)
    spans: list[tuple[int, list[int]]] = []
    for token, mask in zip(traj.token_ids, traj.mask, strict=True):
        if spans and spans[-1][0] == mask:
            spans[-1][1].append(token)
        else:
            spans.append((mask, [token]))
    assistant = [m for m in episode.messages if m.role == "assistant"]
    sampled = [ids for mask, ids in spans if mask == 1]
    assert len(sampled) == len(assistant) == episode.num_turns
    for ids, msg in zip(sampled, assistant, strict=True):
        assert tokenizer.decode(ids, skip_special_tokens=True) == msg.raw
    assert spans[0] == (0, renderer.prompt_ids(episode.task.prompt))
    for mask, lp in zip(traj.mask, traj.logprobs, strict=True):
        assert lp == (LOGPROB if mask else 0.0)
    as_sampled = [
        Message(role="assistant", content=m.raw) if m.role == "assistant" else m
        for m in episode.messages
    ]
    rendered = renderer.render_text(as_sampled, add_generation_prompt=False)
    decoded = tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert rendered.startswith(decoded) and rendered[len(decoded) :].strip() == ""
    env_text = "".join(
        tokenizer.decode(ids, skip_special_tokens=False) for mask, ids in spans[1:] if mask == 0
    )
    for msg in episode.messages[len(episode.task.prompt) :]:
        if msg.role != "assistant":
            assert msg.content in env_text  # every environment message is masked out
