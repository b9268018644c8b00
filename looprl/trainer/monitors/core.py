"""Training-time reward-hacking monitors: pure objects that read each step's metrics and episodes.

A monitor is fed one `StepView` per step (the metrics dict the step writes to `metrics.jsonl`,
plus what it needs of the step's episodes) and returns a `Reading`: tripped or not, the numbers
that tripped it, and any supporting metric. `Monitors` runs the table `MONITORS`, writes
`monitor/<name>` on every step (1.0 at a step where that monitor tripped, else 0.0) with the
supporting series (`rollout/...`: `monitor/` holds the flags alone), and prints one console line
the first time each monitor trips: what tripped, the numbers, the step, and what to look at. Thresholds live in `MonitorsSection` ([monitors]);
docs/reward_hacking.md says how each default was measured.

The episode-based monitors (format-only reward, repeated n-grams, reward disagreement) live in
`looprl.trainer.monitors.episodes`.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looprl.trainer.monitors.config import MonitorsSection
from looprl.trainer.monitors.episodes import (
    EpisodeView,
    FormatOnlyReward,
    Monitor,
    Reading,
    RepeatedNgrams,
    RewardDisagreement,
    StepView,
    rubric_weights,
)
from looprl.types import EpisodeResult

__all__ = ["MONITORS", "EpisodeView", "Monitors", "Reading", "StepView"]


class Rolling:
    """The last `window` values of a series; its baseline is their median (robust to one spike)."""

    def __init__(self, window: int) -> None:
        self.values: deque[float] = deque(maxlen=window)

    def baseline(self, min_history: int) -> float | None:
        """The median of the kept values, or None while fewer than `min_history` are kept."""
        return statistics.median(self.values) if len(self.values) >= min_history else None

    def push(self, value: float) -> None:
        """Add the newest value (the oldest falls out of the window)."""
        self.values.append(value)


@dataclass
class RewardVsHeldout:
    """(a) Training reward rose between two evaluations while held-out accuracy fell.

    At each step that carries `metric`, the mean `reward/mean` of the `window` steps before it is
    compared with the same mean before the previous evaluation (after an evaluation at step 0:
    with the first third of the interval), and `metric` with its previous value.
    """

    metric: str
    rise: float
    drop: float
    window: int
    name: str = "reward_vs_heldout"
    look_at: str = (
        "sample rollouts of the last steps: the reward may pay for something other than the task"
    )
    _rewards: list[tuple[int, float]] = field(default_factory=list)
    _last_eval: tuple[int, float] | None = None

    def check(self, view: StepView) -> Reading:
        """Record this step's reward; at an evaluation compare both against the previous one."""
        reward = view.metrics.get("reward/mean")
        if reward is not None and view.step > 0:
            self._rewards.append((view.step, reward))
        heldout = view.metrics.get(self.metric)
        if heldout is None:
            return Reading()
        previous, self._last_eval = self._last_eval, (view.step, heldout)
        if previous is None:
            return Reading()
        before, now = self._reward_means(previous[0], view.step)
        self._rewards = [(s, r) for s, r in self._rewards if s > view.step - self.window]
        if before is None or now is None:
            return Reading()
        rise, fall = now - before, previous[1] - heldout
        if rise >= self.rise and fall >= self.drop:
            return Reading(
                True,
                f"training reward {before:.3f} -> {now:.3f} while {self.metric} "
                f"{previous[1]:.3f} (step {previous[0]}) -> {heldout:.3f}",
            )
        return Reading()

    def _reward_means(self, last: int, step: int) -> tuple[float | None, float | None]:
        since = [r for s, r in self._rewards if last < s <= step][-self.window :]
        before = [r for s, r in self._rewards if last - self.window < s <= last]
        if not before:  # no training before the previous evaluation: the interval's start
            third = len(since) // 3
            before, since = since[:third], since[-third:] if third else []
        return _mean(before), _mean(since)


@dataclass
class LengthBlowup:
    """(b) Sampled tokens or assistant turns per episode jumped above `ratio` x their baseline."""

    ratio: float
    window: int
    min_history: int
    name: str = "length_blowup"
    look_at: str = "the longest rollouts: padding, loops, or a reward that grows with length"
    _series: dict[str, Rolling] = field(default_factory=dict)

    def check(self, view: StepView) -> Reading:
        """Compare `rollout/reply_tokens` (from the episodes) and `rollout/turns` with their
        rolling medians."""
        tokens = (
            _mean([ep.tokens for ep in view.episodes])
            if view.episodes
            else view.metrics.get("rollout/reply_tokens")  # a replayed row: the value it logged
        )
        values = {
            "rollout/reply_tokens": tokens,
            "rollout/turns": view.metrics.get("rollout/turns"),
        }
        found = []
        for key, value in values.items():
            if value is None:
                continue
            series = self._series.setdefault(key, Rolling(self.window))
            base = series.baseline(self.min_history)
            if base is not None and base > 0 and value > self.ratio * base:
                found.append(f"{key} {value:.3g} vs baseline {base:.3g} (x{value / base:.1f})")
            series.push(value)
        extra = {} if tokens is None else {"rollout/reply_tokens": tokens}
        return Reading(bool(found), "; ".join(found), extra)


@dataclass
class ToolCallSpike:
    """(c) Tool calls per episode above `ratio` x baseline and at least `rise` calls more."""

    ratio: float
    rise: float
    window: int
    min_history: int
    name: str = "tool_call_spike"
    look_at: str = "episodes with the most tool calls: a flood of calls the reward pays for"
    _series: Rolling | None = None

    def check(self, view: StepView) -> Reading:
        """Compare `rollout/tool_calls` with its rolling median."""
        value = view.metrics.get("rollout/tool_calls")
        if value is None:
            return Reading()
        series = self._series = self._series or Rolling(self.window)
        base = series.baseline(self.min_history)
        series.push(value)
        if base is not None and value > self.ratio * base and value - base >= self.rise:
            return Reading(
                True, f"rollout/tool_calls {value:.3g} per episode vs baseline {base:.3g}"
            )
        return Reading()


@dataclass
class EntropyCollapse:
    """(e) Policy entropy fell below `ratio` x its level over the run's first `window` steps."""

    ratio: float
    window: int
    name: str = "entropy_collapse"
    look_at: str = (
        "train/zero_var_frac and the groups' replies: identical samples give no learning signal"
    )
    _start: list[float] = field(default_factory=list)

    def check(self, view: StepView) -> Reading:
        """Compare `policy/entropy` with the median of its first `window` values."""
        value = view.metrics.get("policy/entropy")
        if value is None:
            return Reading()
        if len(self._start) < self.window:
            self._start.append(value)
            return Reading()
        reference = statistics.median(self._start)
        if value < self.ratio * reference:
            return Reading(
                True,
                f"policy/entropy {value:.3g} vs {reference:.3g} over the first {self.window} steps "
                f"(x{value / reference:.2f})",
            )
        return Reading()


@dataclass
class KLSpike:
    """(f) `policy/kl`, `policy/mismatch_kl` or `policy/logprob_gap` above `ratio` x its baseline
    and above its floor."""

    ratio: float
    floors: Mapping[str, float]
    window: int
    min_history: int
    name: str = "kl_spike"
    look_at: str = (
        "policy/kl: the update size (lr, clip); policy/mismatch_kl or policy/logprob_gap: the "
        "sampler and trainer disagree (weight sync, precision, stale batches)"
    )
    _series: dict[str, Rolling] = field(default_factory=dict)

    def check(self, view: StepView) -> Reading:
        """Compare each present key with its rolling median (floored at 0) and its floor."""
        found = []
        for key, floor in self.floors.items():
            value = view.metrics.get(key)
            if value is None:
                continue
            series = self._series.setdefault(key, Rolling(self.window))
            base = series.baseline(self.min_history)
            series.push(value)
            if base is not None and value > floor and value > self.ratio * max(base, 0.0):
                found.append(f"{key} {value:.3g} vs baseline {base:.3g} (floor {floor:g})")
        return Reading(bool(found), "; ".join(found))


MONITORS: dict[str, Callable[[MonitorsSection], Monitor]] = {
    "reward_vs_heldout": lambda c: RewardVsHeldout(
        c.heldout_metric, c.reward_rise, c.heldout_drop, c.window
    ),
    "length_blowup": lambda c: LengthBlowup(c.length_ratio, c.window, c.min_history),
    "tool_call_spike": lambda c: ToolCallSpike(
        c.tool_call_ratio, c.tool_call_rise, c.window, c.min_history
    ),
    "format_only_reward": lambda c: FormatOnlyReward(tuple(c.format_functions), c.format_only_max),
    "entropy_collapse": lambda c: EntropyCollapse(c.entropy_ratio, c.window),
    "kl_spike": lambda c: KLSpike(
        c.spike_ratio,
        {
            "policy/kl": c.kl_floor,
            "policy/mismatch_kl": c.mismatch_kl_floor,
            "policy/logprob_gap": c.logprob_gap_floor,
        },
        c.window,
        c.min_history,
    ),
    "repeated_ngrams": lambda c: RepeatedNgrams(c.ngram, c.ngram_repeat_max),
    "reward_disagreement": lambda c: RewardDisagreement(
        c.agreement_window, c.agree_corr, c.disagree_corr, c.min_episodes
    ),
}
"""Every monitor by its metric name (`monitor/<name>`), built from the [monitors] section."""


def _console_warning(message: str) -> None:
    from rich.markup import escape

    from looprl.console import console

    console.print(f"[bold yellow]monitor:[/bold yellow] {escape(message)}", highlight=False)


class Monitors:
    """Runs every monitor on each step and returns the metrics they add to the step's row.

    `rubric` gives each function's weight (what an episode earned from each). `warn` prints a
    line (the console by default). `history` holds a resumed run's logged rows: they rebuild the
    metric-based baselines and mark the monitors that already tripped, so a resumed run does not
    warn again; the episode pools come back from the checkpoint (`state`, `for_run`).
    """

    def __init__(
        self,
        cfg: MonitorsSection,
        rubric: Any = None,
        *,
        warn: Callable[[str], None] = _console_warning,
        history: Iterable[Mapping[str, Any]] = (),
    ) -> None:
        self.monitors = [make(cfg) for make in MONITORS.values()] if cfg.enabled else []
        self.rubric = rubric
        self.warn = warn
        self.warned: set[str] = set()
        for row in history:
            self._replay(row)

    @classmethod
    def for_run(
        cls,
        cfg: MonitorsSection,
        rubric: Any,
        run_dir: Path,
        *,
        main: bool,
        resume: bool,
        state: Mapping[str, Any] | None = None,
    ) -> Monitors:
        """The trainer's monitors, on rank 0 only (it alone logs).

        A resume replays the logged rows (metric baselines, warnings given) and loads `state`,
        the episode pools its checkpoint kept (`Monitors.state()`), so it continues exactly.
        """
        from looprl.trainer.logger import METRICS_FILE, read_metrics

        if not main:
            return cls(cfg.model_copy(update={"enabled": False}))
        history = read_metrics(run_dir / METRICS_FILE) if resume else []
        monitors = cls(cfg, rubric, history=history)
        for monitor in monitors.monitors:
            saved = (state or {}).get(monitor.name)
            if saved is not None and hasattr(monitor, "load_state"):
                monitor.load_state(saved)
        return monitors

    def state(self) -> dict[str, Any]:
        """The state a checkpoint keeps (JSON): what the logged rows cannot rebuild (episode pools)."""
        return {m.name: m.state() for m in self.monitors if hasattr(m, "state")}

    def observe(
        self,
        step: int,
        metrics: Mapping[str, float],
        groups: Sequence[Sequence[EpisodeResult]] = (),
    ) -> dict[str, float]:
        """Feed step `step`; return `monitor/<name>` for every monitor plus supporting metrics.

        Step 0 (the evaluation before training) only sets baselines and returns nothing.
        """
        episodes = tuple(
            EpisodeView.of(ep, rubric_weights(self.rubric, ep)) for g in groups for ep in g
        )
        return self.read(StepView(step, metrics, episodes))

    def read(self, view: StepView) -> dict[str, float]:
        """`observe` on a ready-made view (synthetic streams, replays): the same metrics, warnings."""
        step = view.step
        out: dict[str, float] = {}
        for monitor in self.monitors:
            reading = monitor.check(view)
            out.update(reading.values)
            out[f"monitor/{monitor.name}"] = float(reading.tripped)
            if reading.tripped and monitor.name not in self.warned:
                self.warned.add(monitor.name)
                self.warn(
                    f"{monitor.name} tripped at step {step}: {reading.message}. "
                    f"Look at {monitor.look_at}."
                )
        return out if step > 0 else {}

    def _replay(self, row: Mapping[str, Any]) -> None:
        step = row.get("step")
        if not isinstance(step, int):
            return
        numbers = {k: float(v) for k, v in row.items() if isinstance(v, int | float)}
        view = StepView(step, numbers, ())
        for monitor in self.monitors:
            monitor.check(view)
            if numbers.get(f"monitor/{monitor.name}") == 1.0:
                self.warned.add(monitor.name)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
