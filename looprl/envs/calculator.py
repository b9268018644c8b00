"""The calculator environment: multi-operation arithmetic solved with a safe `calculate` tool.

Operands are large enough (3 digits, products of them) that a small model cannot work the
answer out in its head, so the reward rises only when it learns to call the tool and copy the
result. A hash of the expression puts one problem in five in the eval split. `digits` sets the
operand sizes (each task records its size in `info["digits"]`); `calculator_text` is the same
tasks without the tool (looprl/envs/calculator_text.py).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Any

from looprl.datasets import train_eval_tasks
from looprl.envs.arithmetic import calculate, safe_eval
from looprl.envs.base import Limits, TaskSource, ToolEnv
from looprl.kit import final_answer_text, split_of, tool_call_validity, used_tool
from looprl.rubrics import Rubric
from looprl.types import EpisodeResult, Message, Task

SYSTEM_PROMPT = (
    "You are a careful assistant. Use the calculate tool for arithmetic, "
    "then reply with 'The answer is N.'"
)


def generate_tasks(
    split: str, n: int, seed: int, digits: Sequence[int] = (3,), env: str = "calculator"
) -> list[Task]:
    """`n` tasks of a split, each two operations on operands of `digits` digits (`481 * 372 - 129`).

    With several sizes each task draws one for all its operands; `info["digits"]` records it, so
    accuracy can be read per operand size. The default (3 digits only) draws no size, so its
    tasks are the same as before sizes existed.
    """
    sizes = operand_sizes(digits)
    rng = random.Random(f"calculator-{split}-{seed}")
    tasks: dict[str, Task] = {}
    while len(tasks) < n:
        d = sizes[0] if len(sizes) == 1 else rng.choice(sizes)
        low, high = 10 ** (d - 1) if d > 1 else 0, 10**d - 1
        terms = [str(rng.randint(low, high))]
        for _ in range(2):
            terms += [rng.choice(["+", "-", "*"]), str(rng.randint(low, high))]
        expr = " ".join(terms)
        if split_of(expr) == split and expr not in tasks:
            tid = f"calc-{hashlib.sha256(expr.encode()).hexdigest()[:12]}"
            prompt = [Message(role="user", content=f"What is {expr}?")]
            answer, info = str(safe_eval(expr)), {"expression": expr, "digits": d}
            tasks[expr] = Task(tid, prompt, answer, info, env=env)
    return list(tasks.values())


def operand_sizes(digits: int | Sequence[int]) -> list[int]:
    """Operand sizes (digits per operand, 1..6) as a sorted list; ValueError names a bad one."""
    sizes = sorted({digits} if isinstance(digits, int) else set(digits))
    if not sizes or any(not isinstance(d, int) or not 1 <= d <= 6 for d in sizes):
        raise ValueError(
            f"digits={digits!r}: give operand sizes from 1 to 6, one (3) or several ([1, 2, 3])"
        )
    return sizes


_ANSWER_RE = re.compile(r"answer is\s*(-?[\d,]+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """The final answer in a reply: the number after 'answer is', else the last number."""
    match = _ANSWER_RE.search(text)
    numbers = [match.group(1)] if match else _NUMBER_RE.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def correct_answer(episode: EpisodeResult) -> float:
    """1.0 when the final reply's answer equals the reference exactly (the accuracy metric)."""
    got = extract_answer(final_answer_text(episode))
    return float(got is not None and episode.task.answer is not None and got == episode.task.answer)


def answer_format(episode: EpisodeResult) -> float:
    """1.0 when the final reply states 'The answer is N.' (metric)."""
    return float(bool(_ANSWER_RE.search(final_answer_text(episode))))


def task_sources(
    env: str,
    digits: int | Sequence[int],
    dataset: str | None,
    eval_dataset: str | None,
    columns: dict[str, Any] | None,
) -> tuple[TaskSource, TaskSource]:
    """The (train, eval) tasks of a calculator variant: the given dataset, else generated ones."""
    sizes = operand_sizes(digits)  # a bad size fails here, before any task is drawn
    generated: tuple[TaskSource, TaskSource] = (
        lambda n, seed: generate_tasks("train", n, seed, sizes, env),
        lambda n, seed: generate_tasks("eval", n, seed, sizes, env),
    )
    return train_eval_tasks(dataset, eval_dataset, env=env, columns=columns) or generated


def load_environment(
    max_turns: int = 4,
    max_tokens_per_turn: int = 96,
    max_context_tokens: int = 1024,
    dataset: str | None = None,
    eval_dataset: str | None = None,
    columns: dict[str, Any] | None = None,
    digits: int | Sequence[int] = 3,
    **kwargs: Any,
) -> ToolEnv:
    """The calculator environment (reward: exact final answer; metrics: format and tool use).

    `dataset` (and `eval_dataset`): your own tasks instead of the generated ones, a file or a
    saved `datasets` directory read by `looprl.datasets.train_eval_tasks`; `columns` maps the
    prompt, answer, info and id columns. Answers are compared with the number the final
    reply states, so write them as plain numbers (`1234`, `-5`, `2.5`). `digits`: the operand
    sizes of the generated tasks (`[1, 2, 3]` mixes three; see `generate_tasks`).
    """
    train, evals = task_sources("calculator", digits, dataset, eval_dataset, columns)
    return ToolEnv(
        name="calculator",
        tools=[calculate],
        rubric=Rubric(
            [correct_answer, answer_format, used_tool, tool_call_validity], [1.0, 0.0, 0.0, 0.0]
        ),
        train_tasks=train,
        eval_tasks=evals,
        limits=Limits(max_turns, max_tokens_per_turn, max_context_tokens),
        system_prompt=kwargs.pop("system_prompt", SYSTEM_PROMPT),
        **kwargs,
    )
