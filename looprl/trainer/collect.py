"""A training step's groups: tasks from the seeded stream, each rolled out G times (refilled when
dynamic sampling drops groups that scored alike), shared across ranks under torchrun."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from looprl.engines.base import TrainableEngine
from looprl.envs.base import Environment
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import RolloutConfig, run_groups
from looprl.trainer import distributed as D
from looprl.trainer.config import TrainConfig
from looprl.trainer.curriculum.sampler import TaskSampler
from looprl.trainer.streaming import has_variance
from looprl.types import EpisodeResult, SamplingParams


def step_seed(seed: int, step: int, tag: str = "train") -> int:
    """A per-step sampling seed, so a resumed run samples exactly what the original would have."""
    return int.from_bytes(hashlib.sha256(f"{seed}|{tag}|{step}".encode()).digest()[:4], "little")


@dataclass
class Collector:
    """What rolling out a step's groups needs; `collect` does it."""

    cfg: TrainConfig
    env: Environment
    engine: TrainableEngine
    renderer: Renderer
    sampling: SamplingParams
    tasks: TaskSampler  # the seeded stream, or a curriculum (it observes every group rolled out)
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
            tasks = self.tasks.draw(cursor + used, need)
            used += need
            groups = await D.run_shared(  # under torchrun: this rank's groups, then all of them
                self.dist, [(t, list(range(rc.rollouts_per_task))) for t in tasks],
                lambda share: run_groups(
                    self.env, self.engine, share, renderer=self.renderer, config=config,
                    max_concurrent_groups=rc.max_concurrent_groups,
                ), main_only=self.main_only,
            )  # fmt: skip
            self.tasks.observe(step, groups)  # every group rolled out counts, kept or not
            if not self.dynamic:
                return groups, time.perf_counter() - start, used
            kept += [g for g in groups if has_variance(g)]
            if len(kept) >= rc.tasks_per_step:
                break
        return kept or groups, time.perf_counter() - start, used
