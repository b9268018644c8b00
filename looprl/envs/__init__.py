"""Environments: tasks, tools, rubric and limits; engine- and trainer-agnostic."""

from looprl.envs.base import Environment, Limits, MultiTurnEnv, SingleTurnEnv, StepOutcome, ToolEnv
from looprl.kit import (
    answer_text,
    final_answer_text,
    final_raw,
    final_reply,
    shown_outcomes,
    split_of,
    tool_call_validity,
    tool_calls,
    used_tool,
)
from looprl.envs.registry import available_environments, load_environment

__all__ = [
    "Environment",
    "Limits",
    "MultiTurnEnv",
    "SingleTurnEnv",
    "StepOutcome",
    "ToolEnv",
    "answer_text",
    "available_environments",
    "final_answer_text",
    "final_raw",
    "final_reply",
    "load_environment",
    "shown_outcomes",
    "split_of",
    "tool_call_validity",
    "tool_calls",
    "used_tool",
]
