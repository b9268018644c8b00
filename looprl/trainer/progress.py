"""What a training run says between its step lines: the phase of a long step, a step with no gradient.

- `StepPhases`: a step that runs long (generation of a big batch, a slow update) shows which
  phase it is in, as a plain line in a log (`step 3/10: training (generating took 42 s)`) or as
  a transient status on a terminal. Short steps stay quiet.
- `NoGradientWarning`: a step where every group's rollouts got the same reward has no
  advantage to learn from; the first such step of a run gets one warning that says what to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.errors import LiveError
from rich.status import Status

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
