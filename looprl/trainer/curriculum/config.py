"""The `[curriculum]` and `[hints]` config sections: which tasks a training step draws, and when
they come with a hint (`looprl.trainer.curriculum.sampler`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class CurriculumSection(BaseModel):
    """A curriculum that follows the pass rate: tasks by `info["difficulty"]`, a level at a time."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(
        False,
        description="draw each step's tasks from one difficulty level (tasks' info['difficulty']: "
        "calculator with env.kwargs.digits = [1, 2, 3], search_qa's hops), moved by the pass rate",
    )
    target_low: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="move down a level when its pass rate falls below this (a group that "
        "always fails has no GRPO signal)",
    )
    target_high: float = Field(
        0.8,
        gt=0,
        le=1,
        description="move up a level when its pass rate rises above this (a group that always "
        "passes has none either)",
    )
    ema: float = Field(
        0.5,
        gt=0,
        le=1,
        description="weight of the newest batch in a level's running pass rate (1: that batch alone)",
    )
    min_groups: int = Field(
        16,
        ge=1,
        description="groups a level must be seen in since the last move before the next "
        "(16: one step of the default rollout.tasks_per_step)",
    )
    start_level: int = Field(
        0, ge=0, description="index of the first level, easiest first (0: the easiest)"
    )
    pass_threshold: float = Field(
        1.0,
        description="an episode passes when its reward reaches this (1.0: full marks on the "
        "bundled environments' 0/1 rewards)",
    )

    @model_validator(mode="after")
    def _band(self) -> CurriculumSection:
        if self.target_low >= self.target_high:
            raise ValueError(
                f"curriculum.target_low ({self.target_low}) must be below curriculum.target_high "
                f"({self.target_high}): the band of pass rates a level is kept in"
            )
        return self


class HintsSection(BaseModel):
    """Hints that fade: a training task is hinted with probability (target - pass rate) / target."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(
        False,
        description="ask the environment for a hint (Environment.hint) on training tasks while "
        "their level's pass rate is below hints.target; never at evaluation",
    )
    target: float = Field(
        0.5,
        gt=0,
        le=1,
        description="the pass rate at which hints stop: probability clamp((target - pass rate) "
        "/ target), 1 before a level has a pass rate (0.5: the middle of the curriculum's band)",
    )
