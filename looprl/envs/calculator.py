"""The calculator environment: multi-operation arithmetic solved with a safe `calculate` tool.

Operands are large enough (3 digits, products of them) that a small model cannot work the
answer out in its head, so the reward rises only when it learns to call the tool and copy the
result. Train and eval splits are disjoint by construction: a problem belongs to the eval split
exactly when a hash of its expression falls in the eval bucket.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any

from looprl.envs.arithmetic import calculate, safe_eval
from looprl.envs.base import Limits, ToolEnv
from looprl.rubrics import Rubric
from looprl.tools.executor import ERROR_KINDS
from looprl.types import EpisodeResult, Message, Task

SYSTEM_PROMPT = (
    "You are a careful assistant. Use the calculate tool for arithmetic, "
    "then reply with 'The answer is N.'"
)
EVAL_BUCKETS = 5  # one hash bucket in five is held out for evaluation


def make_problem(rng: random.Random) -> str:
    """Two operations on 3-digit operands, e.g. `481 * 372 - 129` (fixed width, variable value)."""
    terms = [str(rng.randint(100, 999))]
    for _ in range(2):
        terms += [rng.choice(["+", "-", "*"]), str(rng.randint(100, 999))]
    return " ".join(terms)


def _split_of(expression: str) -> str:
    bucket = int(hashlib.sha256(expression.encode()).hexdigest(), 16) % EVAL_BUCKETS
    return "eval" if bucket == 0 else "train"


def generate_tasks(split: str, n: int, seed: int) -> list[Task]:
    """`n` calculator tasks of a split; the same (split, seed) gives the same tasks."""
    rng = random.Random(f"calculator-{split}-{seed}")
    tasks: list[Task] = []
    seen: set[str] = set()
    while len(tasks) < n:
        expr = make_problem(rng)
        if _split_of(expr) != split or expr in seen:
            continue
        seen.add(expr)
        answer = str(safe_eval(expr))
        tid = f"calc-{hashlib.sha256(expr.encode()).hexdigest()[:12]}"
        prompt = [Message(role="user", content=f"What is {expr}?")]
        tasks.append(
            Task(id=tid, prompt=prompt, answer=answer, info={"expression": expr}, env="calculator")
        )
    return tasks


_ANSWER_RE = re.compile(r"answer is\s*(-?[\d,]+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_answer(text: str) -> str | None:
    """The final answer in a reply: the number after 'answer is', else the last number."""
    match = _ANSWER_RE.search(text)
    if match:
        return match.group(1).replace(",", "")
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def final_reply(episode: EpisodeResult) -> str:
    """Text of the last assistant message (empty when there is none)."""
    for msg in reversed(episode.messages):
        if msg.role == "assistant":
            return msg.content
    return ""


def correct_answer(episode: EpisodeResult) -> float:
    """1.0 when the final reply's answer equals the reference exactly (the accuracy metric)."""
    got = extract_answer(final_reply(episode))
    return float(got is not None and episode.task.answer is not None and got == episode.task.answer)


def answer_format(episode: EpisodeResult) -> float:
    """1.0 when the final reply states 'The answer is N.' (metric)."""
    return float(bool(_ANSWER_RE.search(final_reply(episode))))


def used_tool(episode: EpisodeResult) -> float:
    """1.0 when the episode made at least one valid tool call (metric)."""
    return float(
        episode.num_tool_calls > sum(episode.tool_errors.get(k, 0) for k in _CALL_ERRORS)
        and episode.num_tool_calls > 0
    )


_CALL_ERRORS = ERROR_KINDS


def tool_call_validity(episode: EpisodeResult) -> float:
    """Fraction of tool calls that ran without error (1.0 when there were none) (metric)."""
    if episode.num_tool_calls == 0:
        return 1.0
    bad = sum(episode.tool_errors.get(k, 0) for k in _CALL_ERRORS)
    return 1.0 - bad / episode.num_tool_calls


def load_environment(
    max_turns: int = 4, max_tokens_per_turn: int = 96, max_context_tokens: int = 1024, **kwargs: Any
) -> ToolEnv:
    """The calculator environment (reward: exact final answer; metrics: format and tool use)."""
    rubric = Rubric(
        [correct_answer, answer_format, used_tool, tool_call_validity], weights=[1.0, 0.0, 0.0, 0.0]
    )
    return ToolEnv(
        name="calculator",
        tools=[calculate],
        rubric=rubric,
        train_tasks=lambda n, seed: generate_tasks("train", n, seed),
        eval_tasks=lambda n, seed: generate_tasks("eval", n, seed),
        limits=Limits(
            max_turns=max_turns,
            max_tokens_per_turn=max_tokens_per_turn,
            max_context_tokens=max_context_tokens,
        ),
        system_prompt=kwargs.pop("system_prompt", SYSTEM_PROMPT),
        **kwargs,
    )
