"""Environments: tasks, tools, rubric and limits; engine- and trainer-agnostic."""

from looprl.envs.base import Environment, Limits, MultiTurnEnv, SingleTurnEnv, StepOutcome, ToolEnv
from looprl.envs.registry import available_environments, load_environment

__all__ = [
    "Environment",
    "Limits",
    "MultiTurnEnv",
    "SingleTurnEnv",
    "StepOutcome",
    "ToolEnv",
    "available_environments",
    "load_environment",
]
