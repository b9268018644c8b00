"""Guards against non-finite numbers reaching the weights or the disk.

`train_on_batch` skips an optimizer step whose gradient norm or loss is not finite and counts it
(`train/nonfinite_skipped`). `NonFiniteGuard` stops the run after `max_nonfinite_steps` such
batches in a row, and refuses to write a checkpoint or `final/` from weights that hold NaN or
inf: `keep_last` would otherwise rotate the last good checkpoint out for a broken one.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from looprl.trainer import distributed as D

SKIPPED_KEY = "train/nonfinite_skipped"


def all_finite(modules: Iterable[torch.nn.Module | None], d: D.Dist | None = None) -> bool:
    """Whether every parameter of `modules` is finite, on every rank (each checks its shard)."""
    bad = any(
        not bool(torch.isfinite(p.detach()).all())
        for m in modules
        if m is not None
        for p in m.parameters()
    )
    return D.max_over_ranks(d, int(bad)) == 0


class NonFiniteGuard:
    """Counts batches whose every optimizer step was skipped as non-finite; stops after `limit`."""

    def __init__(self, limit: int, steps_per_batch: int) -> None:
        self.limit = limit
        self.steps_per_batch = steps_per_batch
        self.in_a_row = 0

    def observe(self, step: int, metrics: dict[str, float]) -> None:
        """Count step `step`'s skipped updates; raise a one-line `SystemExit` at the limit."""
        skipped = metrics.get(SKIPPED_KEY, 0.0)
        self.in_a_row = self.in_a_row + 1 if skipped >= self.steps_per_batch else 0
        if self.in_a_row >= self.limit:
            raise SystemExit(
                f"error: step {step}: the loss or gradient norm was not finite on {self.in_a_row} "
                "steps in a row, so no update ran and no checkpoint was written — check the "
                "rewards and the sampler's logprobs in rollouts/, lower optim.lr, or raise "
                "trainer.max_nonfinite_steps"
            )

    @staticmethod
    def check_weights(
        modules: Iterable[torch.nn.Module | None], d: D.Dist | None, what: str
    ) -> None:
        """Refuse to write `what` (a checkpoint, `final/`) from weights with NaN or inf in them."""
        if not all_finite(modules, d):
            raise SystemExit(
                f"error: the weights hold NaN or inf, so {what} was not written — resume from the "
                "last checkpoint with a lower optim.lr, and check the rewards and logprobs"
            )
