"""Evaluation: run an environment against a policy, summarise the episodes, write the results."""

from looprl.eval.run import EvalConfig, EvalJob, EvalOutcome, evaluate_and_report, run_eval
from looprl.eval.summary import evaluate, pass_at_k, summarize

__all__ = [
    "EvalConfig",
    "EvalJob",
    "EvalOutcome",
    "evaluate",
    "evaluate_and_report",
    "pass_at_k",
    "run_eval",
    "summarize",
]
