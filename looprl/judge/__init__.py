"""LLM judges: a rubric scored by another model, hardened against injection, and its config."""

from looprl.judge.config import JudgeConfig, attach_judge, judge_config, make_judge
from looprl.judge.rubric import JudgeRubric, parse_score

__all__ = [
    "JudgeConfig",
    "JudgeRubric",
    "attach_judge",
    "judge_config",
    "make_judge",
    "parse_score",
]
