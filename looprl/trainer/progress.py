"""What a training run says between its step lines: the phase of a long step, a step with no
gradient, a batch that errors spoiled.

- `StepPhases`: a step that runs long (generation of a big batch, a slow update) shows which
  phase it is in, as a plain line in a log (`step 3/10: training (generating took 42 s)`) or as
  a transient status on a terminal. Short steps stay quiet.
- `NoGradientWarning`: a step where every group's rollouts got the same reward has no
  advantage to learn from; the first such step of a run gets one warning that says what to do.
- `ErroredBatches`: a batch whose errors left no group with two scored episodes is skipped (no
  update runs, nothing regenerates it) and says so (`batch skipped (45 of 48 episodes were infra
  errors)`), counted as `train/error_skipped`; `trainer.max_skipped_steps` such steps in a row
  stop the run, and a run whose every step was skipped ends in error before `final/` is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.errors import LiveError
from rich.status import Status

from looprl.types import EpisodeResult

ERROR_SKIPPED_KEY = "train/error_skipped"

QUIET_S = 10.0
"""A step announces its phases once it has run this long (or when the step before took longer)."""


class StepPhases:
    """One announcement per phase of a long training step.

    `begin(step)` starts a step, `enter(phase)` starts a phase (`generating`, `training`,
    `syncing weights`, `evaluating`, `checkpointing`), `end()` ends the step before its step
    line is printed. A phase is announced when the step has already run `quiet_s` seconds, or
    from the start when the previous step took longer than that. With `out=None` (a rank other
    than 0) nothing is shown.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        out: Console | None,
        quiet_s: float = QUIET_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total_steps = total_steps
        self.out = out
        self.quiet_s = quiet_s
        self.clock = clock
        self.step = 0
        self.last_step_s = 0.0
        self._step_start = self._phase_start = clock()
        self._phase = ""
        self._status: Status | None = None

    def begin(self, step: int) -> None:
        """Start step `step` (its first phase is entered with `enter`)."""
        self.step, self._phase = step, ""
        self._step_start = self._phase_start = self.clock()

    def enter(self, phase: str) -> None:
        """Start `phase`; announce it if the step is a long one (see the class doc)."""
        now = self.clock()
        before = f" ({self._phase} took {now - self._phase_start:.0f} s)" if self._phase else ""
        self._phase, self._phase_start = phase, now
        if self.out is None or max(now - self._step_start, self.last_step_s) <= self.quiet_s:
            return
        self._show(f"step {self.step}/{self.total_steps}: {phase}{before}")

    def end(self) -> None:
        """End the step: remember how long it took and clear a terminal's status line."""
        self.last_step_s = self.clock() - self._step_start
        self._phase = ""
        if self._status is not None:
            self._status.stop()
            self._status = None

    def _show(self, text: str) -> None:
        """A line in a log; on a terminal the transient status (a line if another display runs)."""
        assert self.out is not None
        if self.out.is_terminal:
            try:
                if self._status is None:
                    self._status = self.out.status(text)
                    self._status.start()
                else:
                    self._status.update(text)
                return
            except LiveError:  # another live display (a progress bar) holds the terminal
                self._status = None
        self.out.print(text, highlight=False, markup=False, soft_wrap=True)


def no_gradient(row: Mapping[str, Any]) -> bool:
    """Whether a step had no reward signal: every group uniform, or no sample to train on."""
    if row.get(ERROR_SKIPPED_KEY) == 1:  # errors, not uniform rewards: `ErroredBatches` says so
        return False
    skipped = row.get("train/skipped") == 1
    return skipped or (row.get("train/zero_var_frac") or 0.0) >= 1.0


class NoGradientWarning:
    """Warns once per run, at the first step with no gradient, with what to do about it."""

    def __init__(self, rollouts_per_task: int, warn: Callable[[str], None]) -> None:
        self.rollouts_per_task = rollouts_per_task
        self.warn = warn
        self.warned = False

    def check(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Warn if `metrics` (a step's) show no gradient and no warning was given yet."""
        if self.warned or not no_gradient(metrics):
            return
        self.warned = True
        reward = metrics.get("reward/mean")
        at = f" (reward {reward:.3f})" if isinstance(reward, int | float) else ""
        self.warn(
            f"step {step} had no gradient: every group's {self.rollouts_per_task} rollouts got "
            f"the same reward{at}, so no sample has a non-zero advantage — use larger groups "
            f"(--rollout.rollouts_per_task {2 * self.rollouts_per_task}), easier tasks or a "
            "curriculum, or warm-start the model with `looprl sft` (if every rollout already "
            "succeeds, the tasks are too easy)"
        )


def error_counts(episodes: list[EpisodeResult]) -> str:
    """How many of `episodes` errored and of which kind: `45 of 48 episodes were infra errors`."""
    infra = sum(ep.infra_error for ep in episodes)
    env = sum(ep.rollout_error and not ep.infra_error for ep in episodes)
    scoring = sum(ep.scoring_error and not ep.rollout_error for ep in episodes)
    counts = [(n, kind) for n, kind in ((infra, "infra"), (env, "environment"),
                                        (scoring, "scoring")) if n]  # fmt: skip
    total = len(episodes)
    if len(counts) == 1:
        return f"{counts[0][0]} of {total} episodes were {counts[0][1]} errors"
    kinds = ", ".join(f"{n} {kind}" for n, kind in counts)
    return f"{infra + env + scoring} of {total} episodes errored: {kinds}"


class ErroredBatches:
    """What became of a training batch with errored episodes, said truthfully, and a stop when
    errors leave nothing to train on.

    A batch is skipped when its errors left no group with two scored episodes (`train/skipped`
    with `train/groups_used` 0): no update runs and no later step regenerates it, so the line
    says `skipped`. A batch that lost half its episodes or more but kept a group says that the
    update could use only the rest. `limit` skipped batches in a row raise a one-line
    `SystemExit`, and so does `check_trained` when every step this process ran was skipped
    (nothing to export).
    """

    def __init__(self, limit: int, run_dir: Path, say: Callable[[str], None]) -> None:
        self.limit = limit
        self.run_dir = run_dir
        self.say = say
        self.in_a_row = 0
        self.steps = 0
        self.skipped = 0
        self.reason = ""

    def observe(
        self, step: int, metrics: Mapping[str, Any], groups: list[list[EpisodeResult]]
    ) -> dict[str, float]:
        """Say what became of step `step`'s batch; its `train/error_skipped` metric (0 or 1)."""
        from looprl.eval.run import first_error  # here: the metrics readers need none of it

        episodes = [ep for g in groups for ep in g]
        errored = [ep for ep in episodes if ep.errors]
        skipped = bool(errored) and metrics.get("train/skipped") == 1
        skipped = skipped and not metrics.get("train/groups_used")
        self.steps += 1
        self.skipped += skipped
        self.in_a_row = self.in_a_row + 1 if skipped else 0
        if skipped:
            self.reason = f"{error_counts(episodes)}; first: {first_error(errored)}"
            self.say(f"step {step}: batch skipped ({self.reason}) — no update ran")
        elif 2 * len(errored) >= len(episodes) > 0:
            self.say(
                f"step {step}: {error_counts(episodes)}; the update could use only the "
                f"{len(episodes) - len(errored)} that did not (first error: {first_error(errored)})"
            )
        return {ERROR_SKIPPED_KEY: float(skipped)}

    def stop_if_stuck(self, step: int) -> None:
        """Raise a one-line `SystemExit` once `limit` steps in a row were skipped."""
        if self.in_a_row >= self.limit:
            raise SystemExit(
                f"error: step {step}: {self.in_a_row} steps in a row were skipped, so no update "
                f"ran ({self.reason}) — fix the cause (the episodes are in "
                f"{self.run_dir / 'rollouts'}), then `looprl train --resume --run-dir "
                f"{self.run_dir}` continues from the last checkpoint (trainer.max_skipped_steps "
                "sets the limit)"
            )

    def check_trained(self) -> None:
        """Raise a one-line `SystemExit` when every step this process ran was skipped."""
        if self.steps and self.skipped == self.steps:
            raise SystemExit(
                f"error: no step of this run updated the model: all {self.steps} were skipped "
                f"({self.reason}), so final/ was not exported — fix the cause (the episodes are "
                f"in {self.run_dir / 'rollouts'}), then `looprl train --resume --run-dir "
                f"{self.run_dir}`"
            )
