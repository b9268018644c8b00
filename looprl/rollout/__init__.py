"""Episodes: the multi-turn rollout loop and the transcript that keeps its tokens exact."""

from looprl.rollout.loop import RolloutConfig, rollout, run_group, run_groups

__all__ = ["RolloutConfig", "rollout", "run_group", "run_groups"]
