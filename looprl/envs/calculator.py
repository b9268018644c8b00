"""The calculator environment: multi-operation arithmetic solved with a safe `calculate` tool.

Operands are large enough (3 digits, products of them) that a small model cannot work the
answer out in its head, so the reward rises only when it learns to call the tool and copy the
result. The reward is the evaluation's accuracy (`correct_answer`), so the two cannot drift
apart. Read top to bottom: tasks, rubric, `load_environment`; the tool and the expressions come
from `arithmetic.py` (standard library only: the peer benchmarks load it by path).
`calculator_text` is the same tasks without the tool.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from typing import Any

import looprl
from looprl.envs.arithmetic import calculate, operand_sizes, random_expression, safe_eval

SYSTEM_PROMPT = (
    "You are a careful assistant. Use the calculate tool for arithmetic, "
    "then reply with 'The answer is N.'"
)


def generate_tasks(
    split: str, n: int, seed: int, digits: int | Sequence[int] = 3, env: str = "calculator"
) -> list[looprl.Task]:
    """`n` tasks of a split, two operations each (`481 * 372 - 129`); a hash of the expression
    sends one in five to `eval`. `digits`: operand sizes, recorded per task in `info["digits"]`
    and, for the curriculum, `info["difficulty"]`."""
    sizes, rng = operand_sizes(digits), random.Random(f"calculator-{split}-{seed}")
    tasks: dict[str, looprl.Task] = {}
    while len(tasks) < n:
        expr, size = random_expression(rng, sizes)
        if looprl.split_of(expr) == split and expr not in tasks:
            tid = f"calc-{hashlib.sha256(expr.encode()).hexdigest()[:12]}"
            prompt = [looprl.Message(role="user", content=f"What is {expr}?")]
            info = {"expression": expr, "digits": size, "difficulty": size}
            tasks[expr] = looprl.Task(tid, prompt, str(safe_eval(expr)), info, env=env)
    return list(tasks.values())


_ANSWER_RE = re.compile(r"answer is\s*(-?[\d,]+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """The final answer in a reply: the number after 'answer is', else the last number."""
    match = _ANSWER_RE.search(text)
    numbers = [match.group(1)] if match else _NUMBER_RE.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def correct_answer(episode: looprl.EpisodeResult) -> float:
    """1.0 when the final reply's answer equals the reference exactly (the accuracy metric)."""
    got = extract_answer(looprl.final_answer_text(episode))
    return float(got is not None and episode.task.answer is not None and got == episode.task.answer)


def first_call_hint(task: looprl.Task, rng: random.Random) -> looprl.Hint | None:
    """The hint: the `calculate` call on the task's expression already made, with its result
    (the model has only to read it and answer); None for a task of your own without one."""
    expr = task.info.get("expression")
    if not isinstance(expr, str):
        return None
    return looprl.tool_call_hint("calculate", {"expression": expr}, calculate(expr))


def call_note_hint(task: looprl.Task, rng: random.Random) -> looprl.Hint | None:
    """The hint in words: which call to make; the call itself stays the model's to write."""
    expr = task.info.get("expression")
    if not isinstance(expr, str):
        return None
    return looprl.note_hint(f"Hint: call the calculate tool with the expression {expr}.")


HINTS = {
    "call": first_call_hint,
    "note": call_note_hint,
    "answer": looprl.answer_note(
        "Hint: the answer is {answer}. End your reply with: The answer is {answer}."
    ),
}


def answer_format(episode: looprl.EpisodeResult) -> float:
    """1.0 when the final reply states 'The answer is N.' (metric)."""
    return float(bool(_ANSWER_RE.search(looprl.final_answer_text(episode))))


def load_environment(
    max_turns: int = 4,
    max_tokens_per_turn: int = 96,
    max_context_tokens: int = 1024,
    dataset: str | None = None,
    eval_dataset: str | None = None,
    columns: dict[str, Any] | None = None,
    digits: int | Sequence[int] = 3,
    hint_style: str = "call",
    **kwargs: Any,
) -> looprl.ToolEnv:
    """The calculator environment (reward: exact final answer; metrics: format and tool use).

    `dataset` (and `eval_dataset`): your own tasks instead of the generated ones, a file or a
    saved `datasets` directory (`looprl.train_eval_tasks`; `columns` maps the prompt, answer,
    info and id columns); write answers as plain numbers (`1234`, `-5`, `2.5`). `digits`: the
    operand sizes of the generated tasks (`[1, 2, 3]` mixes three: levels for the curriculum).
    `hint_style`: the hint a training task may get under `[hints]`, the first call made for the
    model (`call`, `first_call_hint`) or which call to make, in words (`note`, `call_note_hint`);
    `answer` gives the answer itself, for `looprl bootstrap`'s rationalisation only (RL would
    reward copying it).
    """
    sizes = operand_sizes(digits)  # a bad size fails here, before any task is drawn
    if hint_style not in HINTS:
        raise ValueError(f"calculator hint_style={hint_style!r}: choose one of {sorted(HINTS)}")
    train, evals = looprl.train_eval_tasks(
        dataset, eval_dataset, env="calculator", columns=columns
    ) or (
        lambda n, seed: generate_tasks("train", n, seed, sizes),
        lambda n, seed: generate_tasks("eval", n, seed, sizes),
    )
    return looprl.ToolEnv(
        name="calculator",
        tools=[calculate],
        rubric=looprl.Rubric(
            [correct_answer, answer_format, looprl.used_tool, looprl.tool_call_validity],
            [1.0, 0.0, 0.0, 0.0],
        ),
        train_tasks=train,
        eval_tasks=evals,
        limits=looprl.Limits(max_turns, max_tokens_per_turn, max_context_tokens),
        system_prompt=kwargs.pop("system_prompt", SYSTEM_PROMPT),
        hint=kwargs.pop("hint", HINTS[hint_style]),
        **kwargs,
    )
