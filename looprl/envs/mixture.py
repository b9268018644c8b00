"""Mixtures: one environment whose tasks come from several, each task run and scored by its own.

`MixtureEnv({"calc": calculator_env, "wordle": wordle_env}, weights=[3, 1])` draws training
tasks from its members in proportion to `weights` and tags each with `task.env` (the member's
name). The rollout asks `env.for_task(task)` once per episode, so tools, parser, limits, hooks
and rubric are always the member's own; the mixture's own hooks, `tool_schemas`, `limits` and
rubric only dispatch or summarise, for callers that do not go through `for_task`.
`per_env_summary(episodes)` splits rewards by member for logs.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import looprl
from looprl import load_environment as load_one


class MixtureRubric(looprl.Rubric):
    """Scores each episode with the rubric of the member environment its task belongs to."""

    def __init__(self, envs: Mapping[str, looprl.Environment]) -> None:
        super().__init__()
        self.envs = dict(envs)

    @property
    def names(self) -> list[str]:
        """Every member's reward function and metric names, in member order, without repeats."""
        return list(dict.fromkeys(n for env in self.envs.values() for n in env.rubric.names))

    async def score_group(self, episodes: list[looprl.EpisodeResult]) -> None:
        """Score each member's episodes with its rubric (a group may mix members)."""
        by_env: dict[str, list[looprl.EpisodeResult]] = {}
        for ep in episodes:
            by_env.setdefault(ep.task.env, []).append(ep)
        for name, group in by_env.items():
            await self._member(name).rubric.score_group(group)

    def total(self, episode: looprl.EpisodeResult) -> float:
        """The weighted total under the episode's own member rubric."""
        return self._member(episode.task.env).rubric.total(episode)

    def _member(self, name: str) -> looprl.Environment:
        if name not in self.envs:
            raise ValueError(
                f"episode of env {name!r} is not from this mixture ({sorted(self.envs)})"
            )
        return self.envs[name]


class MixtureEnv(looprl.Environment):
    """Several environments as one: weighted task sampling, per-task dispatch, per-member metrics.

    `envs` is a dict `{name: environment}` or a list (names are then each `env.name`, which must
    differ). `weights` (dict by name or list in order; default equal) sets the share of training
    tasks and of `get_tasks(split, n)`; they need not sum to 1.
    """

    def __init__(
        self,
        envs: Mapping[str, looprl.Environment] | Sequence[looprl.Environment],
        weights: Mapping[str, float] | Sequence[float] | None = None,
        *,
        name: str = "mixture",
    ) -> None:
        members = _named(envs)
        self.envs = members
        self.weights = _weights(list(members), weights)
        limits = looprl.Limits(
            max_turns=max(e.limits.max_turns for e in members.values()),
            max_tokens_per_turn=max(e.limits.max_tokens_per_turn for e in members.values()),
            max_context_tokens=max(e.limits.max_context_tokens for e in members.values()),
            timeout_s=max(e.limits.timeout_s for e in members.values()),
        )
        super().__init__(name=name, rubric=MixtureRubric(members), limits=limits)

    def for_task(self, task: looprl.Task) -> looprl.Environment:
        """The member environment that `task.env` names."""
        env = self.envs.get(task.env)
        if env is None:
            raise ValueError(
                f"task {task.id!r} has env={task.env!r}, which is not a member of mixture {self.name!r} "
                f"({sorted(self.envs)}); take tasks from this mixture's get_tasks or iter_train_tasks"
            )
        return env

    async def ensure_alive(self) -> None:
        """Have every member restart what died since the last batch."""
        for env in self.envs.values():
            await env.ensure_alive()

    def close(self) -> None:
        """Close every member environment."""
        for env in self.envs.values():
            env.close()

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """Every member's tool schemas, first occurrence of each name (the rollout uses the member's own)."""
        seen: dict[str, dict[str, Any]] = {}
        for env in self.envs.values():
            for schema in env.tool_schemas:
                seen.setdefault(schema["function"]["name"], schema)
        return list(seen.values())

    def get_tasks(
        self, split: str = "train", n: int | None = None, seed: int = 0
    ) -> list[looprl.Task]:
        """`n` tasks shared among members by weight (largest remainder), interleaved member by member."""
        names = list(self.envs)
        counts = (
            [None] * len(names) if n is None else _allocate(n, [self.weights[k] for k in names])
        )
        lists = [
            [self._tag(t, k) for t in self.envs[k].get_tasks(split, c, seed)] if c != 0 else []
            for k, c in zip(names, counts, strict=True)
        ]
        out: list[looprl.Task] = []
        for i in range(max((len(x) for x in lists), default=0)):
            out.extend(x[i] for x in lists if i < len(x))
        return out

    def iter_train_tasks(self, seed: int, start: int = 0) -> Iterator[looprl.Task]:
        """An endless stream: each position draws a member by weight, then that member's next task.

        Resuming at `start` replays the member draws before it, so the stream continues exactly.
        """
        names = [k for k in self.envs if self.weights[k] > 0]
        weights = [self.weights[k] for k in names]
        rng = random.Random(f"mixture-{seed}")
        counts = dict.fromkeys(names, 0)
        for _ in range(start):
            counts[rng.choices(names, weights)[0]] += 1
        streams = {k: self.envs[k].iter_train_tasks(seed, start=counts[k]) for k in names}
        while True:
            k = rng.choices(names, weights)[0]
            yield self._tag(next(streams[k]), k)

    async def setup_state(self, task: looprl.Task) -> dict[str, Any]:
        """The member's state, plus `mixture_env` naming the member (for `step` and `cleanup_state`)."""
        state = await self.for_task(task).setup_state(task)
        state["mixture_env"] = task.env
        return state

    async def step(
        self, messages: list[looprl.Message], parsed: looprl.ParsedTurn, state: dict[str, Any]
    ) -> looprl.StepOutcome:
        """The member's move."""
        return await self.envs[state["mixture_env"]].step(messages, parsed, state)

    async def cleanup_state(self, state: dict[str, Any]) -> None:
        """The member's cleanup (nothing when setup never ran)."""
        if state.get("mixture_env") in self.envs:
            await self.envs[state["mixture_env"]].cleanup_state(state)

    @staticmethod
    def _tag(task: looprl.Task, name: str) -> looprl.Task:
        return task if task.env == name else dataclasses.replace(task, env=name)


def _named(
    envs: Mapping[str, looprl.Environment] | Sequence[looprl.Environment],
) -> dict[str, looprl.Environment]:
    members = dict(envs) if isinstance(envs, Mapping) else {e.name: e for e in envs}
    if not members:
        raise ValueError("MixtureEnv needs at least one environment")
    if not isinstance(envs, Mapping) and len(members) != len(envs):
        names = [e.name for e in envs]
        raise ValueError(
            f"environments in a list need distinct names, got {names}; pass a dict {{name: env}}"
        )
    for key, env in members.items():
        if not isinstance(env, looprl.Environment):
            raise TypeError(
                f"mixture member {key!r} is a {type(env).__name__}, not a looprl Environment"
            )
    return members


def _weights(
    names: list[str], weights: Mapping[str, float] | Sequence[float] | None
) -> dict[str, float]:
    if weights is None:
        return dict.fromkeys(names, 1.0)
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise ValueError(f"weights name unknown environments {unknown}; members are {names}")
        out = {k: float(weights.get(k, 0.0)) for k in names}
    else:
        if len(weights) != len(names):
            raise ValueError(
                f"got {len(weights)} weights for {len(names)} environments; give one each"
            )
        out = {k: float(w) for k, w in zip(names, weights, strict=True)}
    if any(w < 0 or not math.isfinite(w) for w in out.values()) or sum(out.values()) <= 0:
        raise ValueError(f"mixture weights must be finite, >= 0 and not all 0, got {out}")
    return out


def _allocate(n: int, weights: list[float]) -> list[int]:
    """Split `n` in proportion to `weights` (largest remainder; ties go to the earlier member)."""
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def per_env_summary(episodes: list[looprl.EpisodeResult]) -> dict[str, dict[str, Any]]:
    """Per `task.env`: episode and error counts, mean reward and mean of each reward function.

    Means use only episodes without errors (as `looprl.eval.summary.summarize` does); `reward` is
    absent when no episode of that environment could be scored.
    """
    by_env: dict[str, list[looprl.EpisodeResult]] = {}
    for ep in episodes:
        by_env.setdefault(ep.task.env, []).append(ep)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(by_env):
        eps = by_env[name]
        scored = [ep for ep in eps if ep.trainable]
        row: dict[str, Any] = {"episodes": len(eps), "errors": len(eps) - len(scored)}
        if scored:
            row["reward"] = statistics.fmean(ep.reward for ep in scored)
            fns = dict.fromkeys(k for ep in scored for k in ep.rewards)
            row["rewards"] = {
                k: statistics.fmean(ep.rewards[k] for ep in scored if k in ep.rewards) for k in fns
            }
        out[name] = row
    return out


def load_environment(
    envs: Sequence[str | Mapping[str, Any]], weights: Sequence[float] | None = None
) -> MixtureEnv:
    """A mixture of registered environments, e.g. `envs=["calculator", {"env": "reasoning_gym", "dataset": "leg_counting"}]`.

    Each item is a name (or module / file path) or a dict whose `env` key names it and whose
    other keys are that environment's `load_environment` arguments.
    """
    members = []
    for item in envs:
        if isinstance(item, str):
            members.append(load_one(item))
        else:
            spec = dict(item)
            if "env" not in spec:
                raise ValueError(f"mixture item {item!r} needs an 'env' key naming the environment")
            members.append(load_one(spec.pop("env"), **spec))
    return MixtureEnv(members, weights)
