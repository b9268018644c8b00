"""Rollouts: run one episode (environment x engine -> EpisodeResult), and groups of them.

`rollout` reads top to bottom: render, generate, parse, let the environment answer (tools,
feedback), append, repeat. Concurrency comes from gathering many episodes; batching is the
engine's business.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from looprl.engines.base import Engine, GenerationRequest
from looprl.envs.base import Environment, Limits
from looprl.rendering.renderer import Renderer
from looprl.types import EpisodeResult, Message, SamplingParams, Task, Trajectory


@dataclass
class RolloutConfig:
    """Sampling settings shared by every episode of a run."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0


def episode_seed(seed: int, task_id: str, rollout_index: int, turn: int) -> int:
    """A stable per-(task, rollout, turn) sampling seed, independent of scheduling order."""
    digest = hashlib.sha256(f"{seed}|{task_id}|{rollout_index}|{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


async def rollout(
    env: Environment,
    engine: Engine,
    task: Task,
    *,
    renderer: Renderer | None,
    config: RolloutConfig | None = None,
    rollout_index: int = 0,
) -> EpisodeResult:
    """Run one episode and return its (unscored) result; never raises for engine or env failures."""
    config = config or RolloutConfig()
    sub_env = env.for_task(task)  # a mixture hands each task to its own environment
    if sub_env is not env and renderer is not None:
        renderer = Renderer(renderer.tokenizer, sub_env.tool_schemas)  # offer that task's tools
    env = sub_env
    result = EpisodeResult(task=task, messages=list(task.prompt), rollout_index=rollout_index)
    start = time.perf_counter()
    state: dict[str, Any] = {}
    try:
        state = await env.setup_state(task)
        await asyncio.wait_for(
            _episode_loop(env, engine, renderer, config, result, state),
            timeout=env.limits.timeout_s,
        )
    except TimeoutError:
        result.truncated = True
        result.stop_reason = "timeout"
        result.errors.append(
            {
                "kind": "infra",
                "message": f"episode exceeded its timeout of {env.limits.timeout_s} s",
            }
        )
    except Exception as exc:  # an environment bug must not take the batch down
        result.stop_reason = "error"
        result.errors.append({"kind": "rollout", "message": f"{type(exc).__name__}: {exc}"})
    finally:
        try:
            await env.cleanup_state(state)
        except Exception as exc:
            result.errors.append(
                {"kind": "rollout", "message": f"cleanup failed: {type(exc).__name__}: {exc}"}
            )
    result.state = state
    result.metrics["template_breaks"] = float(max(0, len(result.trajectories) - 1))
    result.timings["total"] = time.perf_counter() - start
    return result


async def _episode_loop(
    env: Environment,
    engine: Engine,
    renderer: Renderer | None,
    config: RolloutConfig,
    result: EpisodeResult,
    state: dict[str, Any],
) -> None:
    """The turn loop; mutates `result` as it goes so a timeout keeps the partial episode."""
    limits = env.limits
    token_level = engine.token_level and renderer is not None
    messages = result.messages
    segment = Trajectory()
    result.trajectories.append(segment)
    if token_level:
        assert renderer is not None
        segment.extend(renderer.prompt_ids(messages), sampled=False, turn=0)
    turn = 0
    while True:
        budget = min(limits.max_tokens_per_turn, limits.max_context_tokens - len(segment))
        if token_level and budget <= 0:
            result.truncated, result.stop_reason = True, "max_context"
            if turn == 0:  # nothing was generated: there is nothing to score or train on
                result.errors.append({"kind": "rollout", "message": _no_room(len(segment), limits)})
            break
        sampling = _turn_sampling(config, result, turn, budget)
        request = GenerationRequest(
            prompt_ids=list(segment.token_ids) if token_level else None,
            messages=list(messages),
            tools=env.tool_schemas,
            sampling=sampling,
        )
        t0 = time.perf_counter()
        gen = await engine.generate(request)
        result.timings["generate"] = result.timings.get("generate", 0.0) + time.perf_counter() - t0
        if gen.finish_reason == "error":
            result.stop_reason = "error"
            result.errors.append({"kind": "infra", "message": f"engine: {gen.error}"})
            break
        if token_level:
            assert renderer is not None
            segment.extend(gen.token_ids, sampled=True, turn=turn, logprobs=gen.logprobs)
            text = renderer.decode(gen.token_ids)
        else:
            text = gen.text
        parsed = env.parser.parse(text)
        if gen.tool_calls:  # message-level engines return structured calls
            parsed.calls = parsed.calls + gen.tool_calls
        messages.append(
            Message(role="assistant", content=parsed.content, tool_calls=parsed.calls, raw=text)
        )
        turn += 1
        result.num_turns = turn
        if gen.finish_reason == "length":
            context_bound = token_level and budget < limits.max_tokens_per_turn
            result.truncated, result.stop_reason = (
                True,
                "max_context" if context_bound else "max_tokens",
            )
            break
        t0 = time.perf_counter()
        outcome = await env.step(messages, parsed, state)
        result.timings["env"] = result.timings.get("env", 0.0) + time.perf_counter() - t0
        result.num_tool_calls += outcome.num_tool_calls
        result.errors.extend({"kind": "infra", "message": m} for m in outcome.infra_errors)
        for kind, count in outcome.tool_errors.items():
            result.tool_errors[kind] = result.tool_errors.get(kind, 0) + count
        if outcome.done or not outcome.messages:
            result.stop_reason = "done"
            break
        if turn >= limits.max_turns:
            result.truncated, result.stop_reason = True, "max_turns"
            break
        before = list(messages)
        messages.extend(outcome.messages)
        if token_level:
            assert renderer is not None
            segment, appended = _append_env_turn(
                renderer, before, messages, gen.token_ids, result, turn, limits.max_context_tokens
            )
            if not appended:
                result.truncated, result.stop_reason = True, "max_context"
                break


def _no_room(prompt_tokens: int, limits: Limits) -> str:
    return (
        f"the prompt is {prompt_tokens} tokens, leaving no room to generate within "
        f"max_context_tokens={limits.max_context_tokens}; shorten the prompt or raise the "
        "environment's max_context_tokens"
    )


def _append_env_turn(
    renderer: Renderer,
    before: list[Message],
    after: list[Message],
    sampled_ids: list[int],
    result: EpisodeResult,
    turn: int,
    max_context: int,
) -> tuple[Trajectory, bool]:
    """Extend the current segment with glue + suffix (mask 0), or start a new one on a template break.

    Returns the segment to continue and whether the environment turn was appended: a turn that
    would not leave room to generate within `max_context` is not, and the caller stops.
    """
    segment = result.trajectories[-1]
    ext = renderer.extend(before, after, sampled_ids)
    if ext.ok:
        new_ids = ext.glue_ids + ext.suffix_ids
        if len(segment) + len(new_ids) >= max_context:
            return segment, False
        segment.extend(new_ids, sampled=False, turn=turn)
        return segment, True
    new_segment = Trajectory()
    new_segment.extend(ext.full_ids, sampled=False, turn=turn)
    result.trajectories.append(new_segment)
    return new_segment, True


def _turn_sampling(
    config: RolloutConfig, result: EpisodeResult, turn: int, budget: int
) -> SamplingParams:
    """Sampling params for one turn: the run's settings, a per-turn seed and the token budget."""
    base = config.sampling
    return SamplingParams(
        max_tokens=max(1, min(base.max_tokens, budget)),
        temperature=base.temperature,
        top_p=base.top_p,
        top_k=base.top_k,
        stop=list(base.stop),
        seed=episode_seed(config.seed, result.task.id, result.rollout_index, turn),
    )


async def run_group(
    env: Environment,
    engine: Engine,
    task: Task,
    n: int,
    *,
    renderer: Renderer | None,
    config: RolloutConfig | None = None,
) -> list[EpisodeResult]:
    """`n` rollouts of one task, then scoring with the environment's rubric (group functions see all n)."""
    groups = await run_groups(
        env, engine, [(task, list(range(n)))], renderer=renderer, config=config
    )
    return groups[0]


async def run_groups(
    env: Environment,
    engine: Engine,
    groups: list[tuple[Task, list[int]]],
    *,
    renderer: Renderer | None,
    config: RolloutConfig | None = None,
    max_concurrent_groups: int = 64,
    on_group: Callable[[list[EpisodeResult]], Awaitable[None] | None] | None = None,
) -> list[list[EpisodeResult]]:
    """Run many groups concurrently; `groups` pairs each task with the rollout indices to run.

    `on_group` is called as each group finishes (used to stream results to disk and progress).
    """
    sem = asyncio.Semaphore(max_concurrent_groups)

    async def one(task: Task, indices: list[int]) -> list[EpisodeResult]:
        async with sem:
            eps = await asyncio.gather(
                *(
                    rollout(env, engine, task, renderer=renderer, config=config, rollout_index=i)
                    for i in indices
                )
            )
            out = list(eps)
            t0 = time.perf_counter()
            scorable = [ep for ep in out if not ep.rollout_error]
            if scorable:
                await env.for_task(task).rubric.score_group(scorable)
            for ep in out:
                ep.timings["score"] = (time.perf_counter() - t0) / max(1, len(out))
        if on_group is not None:
            maybe = on_group(out)
            if asyncio.iscoroutine(maybe):
                await maybe
        return out

    return list(await asyncio.gather(*(one(t, idx) for t, idx in groups)))
