"""A training step's groups: tasks from the seeded stream, each rolled out G times (refilled when
dynamic sampling drops groups that scored alike), shared across ranks under torchrun."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

from looprl.engines.base import TrainableEngine
from looprl.envs.base import Environment
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import RolloutConfig, run_groups
from looprl.trainer import distributed as D
from looprl.trainer.config import TrainConfig
from looprl.trainer.streaming import has_variance
from looprl.types import EpisodeResult, SamplingParams, Task


def step_seed(seed: int, step: int, tag: str = "train") -> int:
    """A per-step sampling seed, so a resumed run samples exactly what the original would have."""
    return int.from_bytes(hashlib.sha256(f"{seed}|{tag}|{step}".encode()).digest()[:4], "little")


class TaskStream:
    """The environment's seeded training tasks by position; reading on from where the last read
    stopped reuses the open iterator (a seeded generator is not restarted for every batch)."""

    def __init__(self, env: Environment, seed: int) -> None:
        self.env, self.seed = env, seed
        self._open: tuple[int, Any] | None = None  # (next position, iterator)

    def take(self, cursor: int, n: int) -> list[Task]:
        """`n` tasks from position `cursor` on."""
        if self._open is None or self._open[0] != cursor:
            self._open = (cursor, self.env.iter_train_tasks(self.seed, start=cursor))
        it = self._open[1]
        tasks = [next(it) for _ in range(n)]
        self._open = (cursor + n, it)
        return tasks


@dataclass
class Collector:
    """What rolling out a step's groups needs; `collect` does it."""

    cfg: TrainConfig
    env: Environment
    engine: TrainableEngine
    renderer: Renderer
    sampling: SamplingParams
    tasks: TaskStream
    dynamic: bool  # DAPO's dynamic sampling: refill groups that scored alike
    dist: D.Dist | None
    main_only: bool  # vLLM servers: rank 0 alone drives them

    async def collect(self, step: int, cursor: int) -> tuple[list[list[EpisodeResult]], float, int]:
        """Roll out step `step`'s groups from task position `cursor`: (groups, seconds, tasks used)."""
        rc = self.cfg.rollout
        start = time.perf_counter()
        config = RolloutConfig(sampling=self.sampling, seed=step_seed(self.cfg.trainer.seed, step))
        kept: list[list[EpisodeResult]] = []
        used = 0
        for _round in range(1 + (rc.max_refill_rounds if self.dynamic else 0)):
            need = rc.tasks_per_step - len(kept)
            tasks = self.tasks.take(cursor + used, need)
            used += need
            groups = await D.run_shared(  # under torchrun: this rank's groups, then all of them
                self.dist, [(t, list(range(rc.rollouts_per_task))) for t in tasks],
                lambda share: run_groups(
                    self.env, self.engine, share, renderer=self.renderer, config=config,
                    max_concurrent_groups=rc.max_concurrent_groups,
                ), main_only=self.main_only,
            )  # fmt: skip
            if not self.dynamic:
                return groups, time.perf_counter() - start, used
            kept += [g for g in groups if has_variance(g)]
            if len(kept) >= rc.tasks_per_step:
                break
        return kept or groups, time.perf_counter() - start, used
