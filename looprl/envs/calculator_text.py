"""The calculator's tasks without the tool: work the arithmetic out in text (tools vs no tools).

Same tasks (ids, answers, operand sizes), same answer format ("The answer is N.") and the same
reward function as `calculator`; only the `calculate` tool is gone and the system prompt asks
for the working in text. One answer per episode, with room for the steps. `worked_answer` is
its scripted teacher: the steps in the order of precedence, then the answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import looprl
from looprl.envs.arithmetic import operand_sizes, safe_eval
from looprl.envs.calculator import answer_format, correct_answer, generate_tasks

SYSTEM_PROMPT = (
    "You are a careful assistant. You have no tools: work the arithmetic out step by step in "
    "text, then reply with 'The answer is N.'"
)
_QUESTION = re.compile(r"What is (.+?)\?")


def worked_steps(expression: str) -> list[str]:
    """One line per operation of `a op b op c`, products first, then left to right."""
    terms = expression.split()
    values, ops, steps = [terms[0]], [], []
    for op, term in zip(terms[1::2], terms[2::2], strict=True):
        if op == "*":  # precedence: multiply at once
            product = str(safe_eval(f"{values[-1]} * {term}"))
            steps.append(f"{values[-1]} * {term} = {product}")
            values[-1] = product
        else:
            values.append(term)
            ops.append(op)
    total = values[0]
    for op, value in zip(ops, values[1:], strict=True):
        result = str(safe_eval(f"{total} {op} {value}"))
        steps.append(f"{total} {op} {value} = {result}")
        total = result
    return steps


def worked_answer(messages: list[looprl.Message]) -> str:
    """Teacher policy: the question's steps, one a line, then 'The answer is N.'."""
    question = next((m.content for m in messages if m.role == "user"), "")
    found = _QUESTION.search(question)
    if found is None:
        return "I cannot read this question."
    try:
        steps = worked_steps(found.group(1))
    except ValueError:  # not `a op b op c` (a task from a dataset): no worked steps to show
        return "I cannot work this out."
    return "\n".join([*steps, f"The answer is {steps[-1].split(' = ')[-1]}."])


def load_environment(
    max_tokens_per_turn: int = 192,
    max_context_tokens: int = 1024,
    dataset: str | None = None,
    eval_dataset: str | None = None,
    columns: dict[str, Any] | None = None,
    digits: int | Sequence[int] = 3,
    **kwargs: Any,
) -> looprl.SingleTurnEnv:
    """The tool-free calculator (reward: exact final answer; metric: format); arguments as `calculator`'s.

    One turn of up to `max_tokens_per_turn` tokens (192: the calculator's default episode holds
    up to 4 turns of 96, of which the tool calls and the copied result take most).
    """
    sizes, env = operand_sizes(digits), "calculator_text"  # a bad size fails here, not at a draw
    train, evals = looprl.train_eval_tasks(dataset, eval_dataset, env=env, columns=columns) or (
        lambda n, seed: generate_tasks("train", n, seed, sizes, env),
        lambda n, seed: generate_tasks("eval", n, seed, sizes, env),
    )
    return looprl.SingleTurnEnv(
        name="calculator_text",
        rubric=looprl.Rubric([correct_answer, answer_format], [1.0, 0.0]),
        train_tasks=train,
        eval_tasks=evals,
        limits=looprl.Limits(1, max_tokens_per_turn, max_context_tokens),
        system_prompt=kwargs.pop("system_prompt", SYSTEM_PROMPT),
        **kwargs,
    )
