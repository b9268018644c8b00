"""The monitors' records (`StepView`, `EpisodeView`, `Reading`) and the monitors that read episodes.

Format-only reward, repeated n-grams and reward disagreement need more than the metrics row: what
each episode earned from each reward function, and the assistant's replies. `EpisodeView` holds
exactly that much of an `EpisodeResult`, so the monitors stay pure and testable on synthetic data.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from looprl.types import EpisodeResult


@dataclass(frozen=True)
class EpisodeView:
    """What the monitors read of one episode."""

    replies: tuple[str, ...] = ()  # the text of each assistant turn outside tool-call blocks
    rewards: Mapping[str, float] = field(default_factory=dict)  # every function's value
    earned: Mapping[str, float] = field(default_factory=dict)  # weight x value, weighted ones
    tokens: int = 0  # tokens the policy sampled
    scored: bool = True  # no rollout or scoring error: its rewards count

    @classmethod
    def of(cls, episode: EpisodeResult, weights: Mapping[str, float]) -> EpisodeView:
        """The view of a finished episode, given its rubric's weight per function."""
        return cls(
            replies=tuple(m.content for m in episode.messages if m.role == "assistant"),
            rewards=dict(episode.rewards),
            earned={
                k: weights[k] * v for k, v in episode.rewards.items() if weights.get(k, 0.0) != 0
            },
            tokens=episode.num_generated_tokens,
            scored=episode.trainable,
        )


@dataclass(frozen=True)
class StepView:
    """One training step as the monitors see it: its metrics row and its episodes."""

    step: int
    metrics: Mapping[str, float]
    episodes: Sequence[EpisodeView] = ()


@dataclass(frozen=True)
class Reading:
    """A monitor's verdict on one step: tripped, the numbers that tripped it, supporting metrics."""

    tripped: bool = False
    message: str = ""
    values: Mapping[str, float] = field(default_factory=dict)


class Monitor(Protocol):
    """A monitor: a name (its metric is `monitor/<name>`), what to look at, and a step check."""

    name: str
    look_at: str

    def check(self, view: StepView) -> Reading:
        """Read one step (in order) and say whether the monitor trips at it."""
        ...


def rubric_weights(rubric: Any, episode: EpisodeResult) -> dict[str, float]:
    """Each reward function's weight in the rubric that scored `episode` (a mixture's member)."""
    members = getattr(rubric, "envs", None)  # MixtureRubric: one member rubric per environment
    if isinstance(members, Mapping) and episode.task.env in members:
        rubric = members[episode.task.env].rubric
    return {s.name: float(s.weight) for s in getattr(rubric, "specs", ())}


@dataclass
class FormatOnlyReward:
    """(d) Too many episodes earned their reward from format-type functions alone.

    An episode counts when its weighted total is positive and every function that earned it a
    non-zero amount is format-type (its name contains one of `patterns`).
    """

    patterns: tuple[str, ...]
    max_frac: float
    name: str = "format_only_reward"
    look_at: str = "rewarded episodes with wrong answers: the format alone pays"

    def check(self, view: StepView) -> Reading:
        """The fraction of scored episodes paid by format alone, against `max_frac`."""
        scored = [ep for ep in view.episodes if ep.scored]
        if not scored:
            return Reading()
        only = sum(1 for ep in scored if self._format_only(ep))
        frac = only / len(scored)
        message = f"{only} of {len(scored)} episodes ({frac:.0%}) were rewarded by format alone"
        return Reading(frac > self.max_frac, message, {"rollout/format_only_frac": frac})

    def _format_only(self, ep: EpisodeView) -> bool:
        paid = [k for k, v in ep.earned.items() if v != 0]
        return (
            sum(ep.earned.values()) > 0
            and bool(paid)
            and all(any(p in k for p in self.patterns) for k in paid)
        )


def repeated_fraction(text: str, n: int) -> float | None:
    """seq-rep-n of a reply: the share of its word n-grams that repeat an earlier one.

    Welleck et al., "Neural Text Generation with Unlikelihood Training" (arXiv:1908.04319),
    measure seq-rep-4 as 1 - unique 4-grams / 4-grams. None for replies under n words.
    """
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else None


@dataclass
class RepeatedNgrams:
    """(g) The step's replies repeat themselves: mean seq-rep-n above `max_frac`."""

    n: int
    max_frac: float
    name: str = "repeated_ngrams"
    look_at: str = "the longest replies: a loop the reward does not punish (or pays for)"

    def check(self, view: StepView) -> Reading:
        """Mean seq-rep-n over the step's replies of at least n words."""
        fracs = [
            f
            for ep in view.episodes
            for reply in ep.replies
            if (f := repeated_fraction(reply, self.n)) is not None
        ]
        if not fracs:
            return Reading()
        mean = sum(fracs) / len(fracs)
        message = (
            f"replies repeat {mean:.0%} of their {self.n}-grams on average ({len(fracs)} replies)"
        )
        return Reading(mean > self.max_frac, message, {"rollout/repeat_ngram_frac": mean})


def correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation, or None when either series is constant."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 1e-12 or syy <= 1e-12:
        return None
    return sxy / math.sqrt(sxx * syy)


@dataclass
class RewardDisagreement:
    """(h) A reward function and another function that once agreed no longer do.

    For each pair of a weighted reward function `r` and any other function `o`, the Pearson
    correlation and both means are computed over the scored episodes of the last `window` steps
    (at least `min_episodes` holding both). The pair agrees once its correlation reaches `agree`
    (the means then are kept). It trips when the correlation has fallen to `disagree` while `r`'s
    mean rose and `o`'s rose by less than half as much: the reward pays for something `o` does
    not see. A function that saturates (everyone passes it) also loses its correlation, but rose
    with the reward, so it does not trip; a constant function is skipped.
    """

    window: int
    agree: float
    disagree: float
    min_episodes: int
    name: str = "reward_disagreement"
    look_at: str = (
        "episodes where the two functions differ: the reward can be earned without the other"
    )
    _pool: deque[list[Mapping[str, float]]] = field(default_factory=deque)
    _agreed: dict[tuple[str, str], tuple[float, float, float]] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (JSON): the pooled episodes' rewards and the pairs that agreed."""
        return {
            "pool": [[dict(r) for r in step] for step in self._pool],
            "agreed": [[r, o, *v] for (r, o), v in self._agreed.items()],
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from `state()` as saved in a checkpoint."""
        self._pool = deque(state["pool"])
        self._agreed = {(r, o): (c, mr, mo) for r, o, c, mr, mo in state["agreed"]}

    def check(self, view: StepView) -> Reading:
        """Update the pooled statistics; trip on an agreed pair that now disagrees."""
        if not view.episodes:
            return Reading()
        self._pool.append([ep.rewards for ep in view.episodes if ep.scored])  # (steps, episodes)
        while len(self._pool) > self.window:
            self._pool.popleft()
        rows = [r for step in self._pool for r in step]
        weighted = sorted({k for ep in view.episodes for k in ep.earned})
        names = sorted({k for r in rows for k in r})
        found, lowest = [], None
        for r, o in ((r, o) for r in weighted for o in names if o != r):
            both = [(row[r], row[o]) for row in rows if r in row and o in row]
            corr = correlation(*zip(*both, strict=True)) if len(both) >= self.min_episodes else None
            if corr is None:
                continue
            mean_r, mean_o = (sum(x) / len(both) for x in zip(*both, strict=True))
            if corr >= self.agree:
                self._agreed.setdefault((r, o), (corr, mean_r, mean_o))
            if (r, o) not in self._agreed:
                continue
            lowest = corr if lowest is None else min(lowest, corr)
            was, r0, o0 = self._agreed[(r, o)]
            if corr <= self.disagree and mean_r > r0 and mean_o - o0 < (mean_r - r0) / 2:
                found.append(
                    f"{r} and {o}: correlation {was:.2f} -> {corr:.2f} while {r} "
                    f"{r0:.2f} -> {mean_r:.2f} and {o} {o0:.2f} -> {mean_o:.2f}"
                )
        values = {} if lowest is None else {"rollout/reward_agreement": lowest}
        return Reading(bool(found), "; ".join(found), values)
