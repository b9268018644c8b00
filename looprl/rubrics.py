"""Rubrics: weighted reward functions, zero-weight metrics and group-level rewards.

Every reward function has one fixed signature::

    def reward(episode: EpisodeResult) -> float            # sync or async

and sees the whole episode (task with its answer and info, messages, per-episode state). A
group-level function takes the list of episodes sampled for one task and returns one float per
episode. A function that raises is a *scoring error*: its message is recorded on the episode
(`errors`, kind `scoring`) and the episode is excluded from training statistics. It is never
turned into a silent 0.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from looprl.types import EpisodeResult

RewardFn = Callable[[EpisodeResult], float | Awaitable[float]]
GroupRewardFn = Callable[[list[EpisodeResult]], Sequence[float] | Awaitable[Sequence[float]]]


@dataclass
class RewardSpec:
    """One scoring function with its weight (0 = a metric that is logged but not rewarded)."""

    fn: Callable
    """The function: `fn(episode) -> float`, or `fn(episodes) -> list[float]` for a group."""
    weight: float = 1.0
    """Its weight in the total reward (0: a logged metric)."""
    name: str = ""
    """The name it is logged under (default: the function's `__name__`)."""
    group: bool = False
    """It scores a whole group of rollouts of one task at once."""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = getattr(self.fn, "__name__", "reward")


@dataclass
class Rubric:
    """A weighted sum of reward functions plus zero-weight metrics.

    Build it from functions and weights, e.g.
    `Rubric([correct_answer, uses_tool], weights=[1.0, 0.0])`, or add group-level functions
    with `group_funcs=`. The episode's `reward` is the weighted sum; every function's value is
    also stored in `episode.rewards[name]`.
    """

    funcs: list[Callable] = field(default_factory=list)
    """Per-episode functions, `fn(episode: EpisodeResult) -> float` (sync or async)."""
    weights: list[float] | None = None
    """One weight per function (default: all 1.0; 0 makes a metric)."""
    group_funcs: list[Callable] = field(default_factory=list)
    """Functions of a task's whole group: `fn(episodes) -> list[float]`."""
    group_weights: list[float] | None = None
    """One weight per group function (default: all 1.0)."""

    def __post_init__(self) -> None:
        weights = self.weights if self.weights is not None else [1.0] * len(self.funcs)
        if len(weights) != len(self.funcs):
            raise ValueError(
                f"Rubric got {len(self.funcs)} functions but {len(weights)} weights; "
                "give one weight per function (0.0 for a logged-only metric)"
            )
        gweights = (
            self.group_weights if self.group_weights is not None else [1.0] * len(self.group_funcs)
        )
        if len(gweights) != len(self.group_funcs):
            raise ValueError("Rubric group_weights must have one weight per group function")
        self.specs = [RewardSpec(f, w) for f, w in zip(self.funcs, weights, strict=True)]
        self.specs += [
            RewardSpec(f, w, group=True) for f, w in zip(self.group_funcs, gweights, strict=True)
        ]
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(f"reward function names must be unique, got {names}")

    @property
    def names(self) -> list[str]:
        """Names of all reward functions and metrics, in order."""
        return [s.name for s in self.specs]

    def add(self, fn: Callable, weight: float = 1.0) -> None:
        """Append a per-episode reward function (weight 0: a metric), e.g. an LLM judge."""
        spec = RewardSpec(fn, weight)
        if spec.name in self.names:
            raise ValueError(f"the rubric already has a function named {spec.name!r}")
        self.weights = [*(self.weights or [1.0] * len(self.funcs)), weight]
        self.funcs.append(fn)
        self.specs.append(spec)

    async def score_group(self, episodes: list[EpisodeResult]) -> None:
        """Score the episodes of one task in place: per-episode then group-level functions."""
        await asyncio.gather(*(self._score_one(ep) for ep in episodes))
        for spec in self.specs:
            if spec.group:
                await self._score_group_fn(spec, episodes)
        for ep in episodes:
            ep.reward = self.total(ep)

    async def score(self, episode: EpisodeResult) -> None:
        """Score one episode in place (group-level functions see a group of one)."""
        await self.score_group([episode])

    def total(self, episode: EpisodeResult) -> float:
        """Weighted sum over the reward functions this episode has values for."""
        return float(
            sum(s.weight * episode.rewards.get(s.name, 0.0) for s in self.specs if s.weight)
        )

    async def _score_one(self, ep: EpisodeResult) -> None:
        for spec in self.specs:
            if spec.group:
                continue
            try:
                value = spec.fn(ep)
                if inspect.isawaitable(value):
                    value = await value
                ep.rewards[spec.name] = _as_float(value, spec.name)
            except Exception as exc:  # a reward that raises is recorded, never a silent 0
                _record_scoring_error(ep, spec.name, exc)

    async def _score_group_fn(self, spec: RewardSpec, episodes: list[EpisodeResult]) -> None:
        try:
            values = spec.fn(episodes)
            if inspect.isawaitable(values):
                values = await values
            values = list(values)
            if len(values) != len(episodes):
                raise ValueError(f"returned {len(values)} values for a group of {len(episodes)}")
            for ep, v in zip(episodes, values, strict=True):
                ep.rewards[spec.name] = _as_float(v, spec.name)
        except Exception as exc:
            for ep in episodes:
                _record_scoring_error(ep, spec.name, exc)


REWARD_BOUND = 1e6
"""The largest reward magnitude accepted. Advantages, returns and their squares (group standard
deviations, value losses) are float32 on the trainer, whose range ends near 3.4e38: a reward of
1e39 becomes inf there and NaN weights one step later. 1e6 keeps a square (1e12) and a sum over
any batch far inside that range, and no sensible reward comes near it; a larger one is a bug."""


def _as_float(value: object, name: str) -> float:
    """Coerce a reward to float, rejecting NaN/inf, magnitudes above `REWARD_BOUND` and
    non-numbers with a clear message (the caller records it as a scoring error)."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float):
        raise TypeError(
            f"reward function {name!r} returned {type(value).__name__}, expected a float"
        )
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"reward function {name!r} returned {out}, expected a finite float")
    if abs(out) > REWARD_BOUND:
        raise ValueError(
            f"reward function {name!r} returned {out:g}, beyond the bound of {REWARD_BOUND:g} "
            "(float32 advantages would overflow); scale the reward down"
        )
    return out


def _record_scoring_error(ep: EpisodeResult, name: str, exc: Exception) -> None:
    """Store a scoring error on the episode (kind `scoring`) with the function and message."""
    ep.errors.append(
        {"kind": "scoring", "function": name, "message": f"{type(exc).__name__}: {exc}"}
    )
