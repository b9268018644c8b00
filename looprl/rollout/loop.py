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

from looprl.engines.base import Engine
from looprl.envs.base import Environment, Limits, StepOutcome
from looprl.rendering.parser import ParsedTurn, structured_call
from looprl.rendering.reasoning import split_reasoning
from looprl.rendering.renderer import Renderer
from looprl.rollout.transcript import MessageTranscript, TokenTranscript, Transcript
from looprl.tools.hung import ToolsHung
from looprl.types import (
    EpisodeResult,
    Generation,
    Message,
    SamplingParams,
    StopReason,
    Task,
    ToolCall,
)


@dataclass
class RolloutConfig:
    """Sampling settings shared by every episode of a run."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Sampling settings of every turn (`max_tokens` is lowered to fit the limits)."""
    seed: int = 0
    """Base of the per-(task, rollout, turn) sampling seeds (`episode_seed`)."""


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
    """Run one episode and return its (unscored) result; never raises for engine or env failures.

    The one exception is `ToolsHung`: with no thread left for a sync tool, the run must stop.
    """
    config = config or RolloutConfig()
    env = env.for_task(task)  # a mixture hands each task to its own environment
    result = EpisodeResult(task=task, messages=list(task.prompt), rollout_index=rollout_index)
    start = time.perf_counter()
    state: dict[str, Any] = {}
    clock = EnvClock(env.limits.timeout_s)
    try:
        state = await clock.run(env.setup_state(task))
        transcript = _transcript(env, engine, renderer, result)
        # the loop in a task of its own, as always: the order in which episodes reach the
        # engine (hence the batches it forms) is what exact resume was verified with
        loop = _episode_loop(env, engine, transcript, config, result, state, clock)
        await asyncio.ensure_future(loop)
    except TimeoutError:
        _stop(
            result,
            "timeout",
            infra=f"the environment (set-up, tools, feedback) took longer than its timeout of "
            f"{env.limits.timeout_s} s in this episode",
        )
    except ToolsHung:
        raise  # no thread is left for any tool: the run stops, not this episode alone
    except Exception as exc:  # an environment bug must not take the batch down
        _stop(result, "error", error=f"{type(exc).__name__}: {exc}")
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


class EnvClock:
    """The environment's share of an episode's wall clock: set-up, tools and feedback.

    Time spent waiting for the model does not count: an engine under load queues requests (a
    large evaluation on a slow machine), and that must not end every episode in a timeout. The
    model's side is bounded by its token limits and by the engine's own failure handling.
    """

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.used_s = 0.0

    async def run(self, work: Awaitable[Any]) -> Any:
        """Await `work` within what is left of the budget; TimeoutError when it runs out.

        In the caller's own task (no new task per call, unlike `wait_for`), so the order in
        which episodes reach the engine does not change.
        """
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(max(0.0, self.limit_s - self.used_s)):
                return await work
        finally:
            self.used_s += time.perf_counter() - t0


def _transcript(
    env: Environment, engine: Engine, renderer: Renderer | None, result: EpisodeResult
) -> Transcript:
    """Token-exact when the engine samples token ids and a renderer is given; else messages."""
    limit = env.limits.max_context_tokens
    if engine.token_level and renderer is not None:
        return TokenTranscript(result, env.tool_schemas, limit, renderer, engine)
    return MessageTranscript(result, env.tool_schemas, limit)


async def _episode_loop(
    env: Environment,
    engine: Engine,
    transcript: Transcript,
    config: RolloutConfig,
    result: EpisodeResult,
    state: dict[str, Any],
    clock: EnvClock,
) -> None:
    """The turn loop; mutates `result` as it goes so a timeout keeps the partial episode."""
    limits = env.limits
    turn = 0
    while True:
        budget = min(limits.max_tokens_per_turn, transcript.room())
        if budget <= 0:  # only a token-exact context can fill up
            prompt = limits.max_context_tokens - transcript.room()
            no_room = _no_room(prompt, limits) if turn == 0 else None
            return _stop(result, "max_context", error=no_room)
        sampling = _turn_sampling(config, result, turn, budget)
        t0 = time.perf_counter()
        gen = await engine.generate(transcript.request(sampling))
        _add_time(result, "generate", t0)
        _count_usage(result, gen)
        if gen.finish_reason == "error":
            return _stop(result, "error", infra=f"engine: {gen.error}")
        text = transcript.add_sampled(gen, turn)
        parsed = _parse(env, transcript, text)
        calls = parsed.calls + gen.tool_calls  # message-level engines return structured calls
        _add_structured(parsed, gen.tool_calls)
        result.messages.append(
            Message(
                role="assistant", content=parsed.content, tool_calls=calls, raw=text,
                reasoning_content=parsed.reasoning,
            )
        )  # fmt: skip
        turn = result.num_turns = turn + 1
        if gen.finish_reason == "length":
            by_context = transcript.exact and budget < limits.max_tokens_per_turn
            return _stop(result, "max_context" if by_context else "max_tokens")
        t0 = time.perf_counter()
        outcome = await clock.run(env.step(result.messages, parsed, state))
        _add_time(result, "env", t0)
        _record(result, outcome)
        if outcome.done or not outcome.messages:
            return _stop(result, "done")
        if turn >= limits.max_turns:
            return _stop(result, "max_turns")
        if not transcript.add_env_turn(outcome.messages, turn):
            return _stop(result, "max_context")


def _parse(env: Environment, transcript: Transcript, text: str) -> ParsedTurn:
    """Reasoning, content and calls of a turn: in the model's format when token-exact (the
    renderer knows the template), else with the environment's parser and `<think>` markers."""
    if isinstance(transcript, TokenTranscript):
        return transcript.renderer.parse(text)
    reasoning, rest = split_reasoning(text)
    parsed = env.parser.parse(rest)
    parsed.reasoning = reasoning
    return parsed


def _add_structured(parsed: ParsedTurn, calls: list[ToolCall]) -> None:
    """Add an engine's structured calls to the turn: valid ones as calls, the rest as errors."""
    for item in map(structured_call, calls):
        if isinstance(item, ToolCall):
            parsed.calls.append(item)
        else:
            parsed.errors.append(item)


def _stop(
    result: EpisodeResult, reason: StopReason, *, error: str | None = None, infra: str | None = None
) -> None:
    """End the episode: its stop reason, whether a limit cut it, and an error record if any."""
    result.stop_reason = reason
    result.truncated = reason in ("max_turns", "max_tokens", "max_context", "timeout")
    if error is not None:
        result.errors.append({"kind": "rollout", "message": error})
    if infra is not None:
        result.errors.append({"kind": "infra", "message": infra})


def _count_usage(result: EpisodeResult, gen: Generation) -> None:
    """Add the tokens a server counted for this turn (its `usage`) to the episode's metrics."""
    for key, value in (
        ("prompt_tokens", gen.prompt_tokens),
        ("completion_tokens", gen.completion_tokens),
    ):
        if value is not None:
            result.metrics[key] = result.metrics.get(key, 0.0) + value


def _record(result: EpisodeResult, outcome: StepOutcome) -> None:
    """Add a step's tool calls, tool errors by kind and infrastructure faults to the episode."""
    result.num_tool_calls += outcome.num_tool_calls
    for kind, count in outcome.tool_errors.items():
        result.tool_errors[kind] = result.tool_errors.get(kind, 0) + count
    result.errors.extend({"kind": "infra", "message": m} for m in outcome.infra_errors)
    result.tool_outcomes.extend(outcome.tool_outcomes)


def _add_time(result: EpisodeResult, phase: str, since: float) -> None:
    result.timings[phase] = result.timings.get(phase, 0.0) + time.perf_counter() - since


def _no_room(prompt_tokens: int, limits: Limits) -> str:
    return (
        f"the prompt is {prompt_tokens} tokens, leaving no room to generate within "
        f"max_context_tokens={limits.max_context_tokens}; shorten the prompt or raise the "
        "environment's max_context_tokens"
    )


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
    First the environment restarts what died since the last batch (`Environment.ensure_alive`).
    """
    await env.ensure_alive()
    sem = asyncio.Semaphore(max_concurrent_groups)

    async def one(task: Task, indices: list[int]) -> list[EpisodeResult]:
        sub = env.for_task(task)  # resolved once per group (a mixture's own environment)
        async with sem:
            eps = await asyncio.gather(
                *(
                    rollout(sub, engine, task, renderer=renderer, config=config, rollout_index=i)
                    for i in indices
                )
            )
            out = list(eps)
            t0 = time.perf_counter()
            scorable = [ep for ep in out if not ep.rollout_error]
            if scorable:
                await sub.rubric.score_group(scorable)
            for ep in out:
                ep.timings["score"] = (time.perf_counter() - t0) / max(1, len(out))
        if on_group is not None:
            maybe = on_group(out)
            if asyncio.iscoroutine(maybe):
                await maybe
        return out

    return list(await asyncio.gather(*(one(t, idx) for t, idx in groups)))
