"""What a training run says between its step lines: the phase of a long step, a step with no
gradient, a batch that errors spoiled.

- `StepPhases`: a step that runs long (generation of a big batch, a slow update) shows which
  phase it is in, as a plain line in a log (`step 3/10: training (generating took 42 s)`) or as
  a transient status on a terminal. Short steps stay quiet.
- `NoGradientWarning`: groups whose rollouts all got the same reward have no advantage to
  learn from. A streak of steps where most groups scored alike (or one where all did) gets one
  warning that says what to do, told apart by whether those groups all succeeded or all
  failed; a run most of whose steps were such gets one more line at its end.
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


STREAK_STEPS = 3
"""Steps in a row with most groups scored alike before the warning (a step with all of them
alike warns at once): one such step is noise, three say the tasks do not fit the model."""


ALIKE_KEYS = ("zero_var_frac", "groups_all_correct_frac", "groups_all_wrong_frac")


def _alike(metrics: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(groups, scored alike, alike and all solved, alike and none solved) of a step's metrics."""
    groups = int(metrics.get("train/groups_used") or 0)
    alike, right, wrong = (round(groups * (metrics.get(f"train/{k}") or 0.0)) for k in ALIKE_KEYS)
    return groups, alike, right, wrong


def signal_fix(all_right: float, all_wrong: float, rollouts_per_task: int) -> str:
    """What to do about groups that scored alike, by which kind dominates."""
    if all_right > all_wrong:
        return (
            "the tasks are too easy for the model: train on harder ones (a curriculum section "
            "keeps them at its level)"
        )
    return (
        f"raise rollout.rollouts_per_task (--rollout.rollouts_per_task {2 * rollouts_per_task}), "
        "add a curriculum section of easier tasks, or warm-start with `looprl bootstrap` (or "
        "`looprl sft` on traces)"
    )


class NoGradientWarning:
    """Says when the groups stop teaching, with the fix: once per streak, and once at the end.

    A step where at least half the groups scored alike (zero reward variance, so zero advantage)
    extends a streak; a step with fewer ends it. The streak is warned about once, when it
    reaches `STREAK_STEPS` steps or at once when a step had no gradient at all, in one line:
    `step 7: 12 of 16 groups scored alike for 3 steps (no learning signal from them: 10 all
    solved, 2 all failed): the tasks are too easy ...`. `finish` adds one line when most of the
    steps this process ran were such. The counts are the step's `train/zero_var_frac`,
    `train/groups_all_correct_frac` and `train/groups_all_wrong_frac` times `train/groups_used`.
    """

    def __init__(self, rollouts_per_task: int, warn: Callable[[str], None]) -> None:
        self.rollouts_per_task = rollouts_per_task
        self.warn = warn
        self.streak = 0
        self.warned = False  # this streak was warned about
        self.steps = self.mostly_alike = self.no_gradient = 0
        self.right = self.wrong = 0  # groups alike and all solved / none solved, over the run

    def check(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Count step `step`'s alike groups; warn at the streak's `STREAK_STEPS`-th step (or now)."""
        groups, alike, right, wrong = _alike(metrics)
        none = no_gradient(metrics)
        self.steps += 1
        self.right, self.wrong = self.right + right, self.wrong + wrong
        if not (none or 2 * alike >= groups > 0):
            self.streak, self.warned = 0, False
            return
        self.streak += 1
        self.mostly_alike += 1
        self.no_gradient += none
        if self.warned or (not none and self.streak < STREAK_STEPS):
            return
        self.warned = True
        span = f" for {self.streak} steps" if self.streak > 1 else ""
        what = "no update ran" if metrics.get("train/uniform_steps_skipped") == 1 else "no gradient"
        self.warn(
            f"step {step}: {alike} of {groups} groups scored alike{span} (no learning signal "
            f"from them: {right} all solved, {wrong} all failed{'; ' + what if none else ''}): "
            + signal_fix(right, wrong, self.rollouts_per_task)
        )

    def finish(self) -> None:
        """One line at the end of a run most of whose steps had most groups scored alike."""
        if 2 * self.mostly_alike <= self.steps:
            return
        self.warn(
            f"{self.mostly_alike} of this run's {self.steps} steps had most groups scored alike "
            f"({self.no_gradient} with no learning signal at all; alike groups: {self.right} all "
            f"solved, {self.wrong} all failed): "
            + signal_fix(self.right, self.wrong, self.rollouts_per_task)
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
