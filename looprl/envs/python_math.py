"""The `python_math` environment: math word problems solved with a sandboxed Python tool.

Problems come from a seeded generator with exact answers (disjoint train/eval splits by hash
bucket) or from your dataset (`looprl.datasets`: JSONL, CSV, Parquet or a saved `datasets`
directory with `question` and `answer` columns, or others mapped with `columns`). The model
runs code in its own persistent sandbox session (ReTool / ToRL style; `session=False` gives the
stateless tool) and states the final answer as `\\boxed{...}` or `The answer is ...`. Reward:
answer equivalence checked by `math-verify`. An infrastructure failure of the sandbox
(`sandbox_error`) is never the model's fault: the reward function raises, so the episode is a
scoring error and is left out of training statistics instead of being scored 0.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from fractions import Fraction
from typing import Any

import looprl

SYSTEM_PROMPT = (
    "Solve the problem. Use the python tool to compute exactly, then give the final answer as "
    "\\boxed{ANSWER}."
)
PYTHON_TOOLS = ("python", "python_session")
ANSWER_HINT = "Hint: the answer is {answer}. End your reply with \\boxed{{{answer}}}."
CALL_ANSWER_HINT = "Hint: the output above is the answer. End your reply with \\boxed{{{answer}}}."


def _templates(rng: random.Random) -> tuple[str, Fraction, str]:
    """One word problem, its exact answer and Python code that prints the answer."""
    kind = rng.randrange(5)
    if kind == 0:
        price, n, paid = rng.randint(3, 49), rng.randint(11, 99), 5000
        return (
            f"A pen costs {price} cents. Ana buys {n} pens and pays with {paid} cents. How many cents of change does she get?",
            Fraction(paid - price * n),
            f"print({paid} - {price} * {n})",
        )
    if kind == 1:
        a, b = rng.randint(120, 999), rng.randint(12, 99)
        return (
            f"What is the remainder when {a}^3 is divided by {b}?",
            Fraction(a**3 % b),
            f"print({a} ** 3 % {b})",
        )
    if kind == 2:
        n = rng.randint(20, 60)
        return (
            f"What is the sum of the squares of the integers from 1 to {n}?",
            Fraction(n * (n + 1) * (2 * n + 1) // 6),
            f"print(sum(i * i for i in range(1, {n} + 1)))",
        )
    if kind == 3:
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        c, d = rng.randint(2, 30), rng.randint(2, 30)
        return (
            f"Compute {a}/{b} + {c}/{d} as a reduced fraction.",
            Fraction(a, b) + Fraction(c, d),
            f"from fractions import Fraction\nprint(Fraction({a}, {b}) + Fraction({c}, {d}))",
        )
    n, k = rng.randint(10, 30), rng.randint(2, 6)
    from math import comb

    return (
        f"In how many ways can a team of {k} be chosen from {n} people?",
        Fraction(comb(n, k)),
        f"from math import comb\nprint(comb({n}, {k}))",
    )


def _fmt(value: Fraction) -> str:
    return (
        str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    )


def generate_tasks(split: str, n: int, seed: int) -> list[looprl.Task]:
    """`n` generated problems of a split; the same (split, seed) gives the same problems."""
    rng = random.Random(f"python_math-{split}-{seed}")
    tasks: list[looprl.Task] = []
    seen: set[str] = set()
    while len(tasks) < n:
        question, answer, code = _templates(rng)
        if looprl.split_of(question) != split or question in seen:
            continue
        seen.add(question)
        tid = "pm-" + hashlib.sha256(question.encode()).hexdigest()[:12]
        tasks.append(
            looprl.Task(
                id=tid,
                prompt=[looprl.Message(role="user", content=question)],
                answer=_fmt(answer),
                env="python_math",
                info={"code": code},
            )
        )
    return tasks


_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_ANSWER_IS = re.compile(r"answer is[:\s]*\$?([^\s$]+?)\$?\.?\s*$", re.IGNORECASE | re.MULTILINE)


def final_answer(episode: looprl.EpisodeResult) -> str | None:
    """The boxed answer (or 'The answer is X') of the last assistant message."""
    text = looprl.final_answer_text(episode)
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    found = _ANSWER_IS.findall(text)
    return found[-1].strip() if found else None


class SandboxFailure(RuntimeError):
    """The sandbox itself failed during the episode: not the model's mistake."""


def python_statuses(episode: looprl.EpisodeResult) -> list[str]:
    """The sandbox status of each python call whose result the model saw, in order.

    `ok`, `error`, `timeout`, `sandbox_error`...; "" for a call that failed before the sandbox
    ran it (a bad argument, the tool layer's timeout). Read from `episode.tool_outcomes`; an
    episode recorded before outcomes were kept falls back to the `status:` line of the tool
    messages after its prompt (a hinted call is part of the prompt: not the model's).
    """
    if episode.tool_outcomes:
        return [o.status for o in looprl.shown_outcomes(episode) if o.name in PYTHON_TOOLS]
    texts = [
        m.content
        for m in looprl.model_messages(episode)
        if m.role == "tool" and m.name in PYTHON_TOOLS
    ]
    return [
        t.partition("\n")[0].removeprefix("status: ") if t.startswith("status: ") else ""
        for t in texts
    ]


_DECIMAL = re.compile(r"^-?(?:\d+|\d{1,3}(?:,\d{3})+)(?:\.\d+)?$")
_DRESSING = re.compile(r"^\s*[A-Za-z]\s*=\s*|\s*(?:\\text\{)?[A-Za-z ]+\}?\s*$")
_FRACTIONS = (
    re.compile(r"^(-?\d+)\s*/\s*(\d+)$"),
    re.compile(r"^-?\\[dt]?frac\{(-?\d+)\}\{(\d+)\}$"),
)


def _is_number(text: str) -> bool:
    """An integer, a decimal (thousands separators allowed) or a fraction of two integers
    (`a/b`, `\\frac{a}{b}`), after an `x =` before it and a unit word after it are dropped."""
    text = _DRESSING.sub("", text).strip()
    return bool(_DECIMAL.match(text)) or any(p.match(text) for p in _FRACTIONS)


def not_in_lowest_terms(question: str, answer: str) -> bool:
    """True when the question asks for a reduced fraction and `answer` is one that is not."""
    if "reduced fraction" not in question.lower():
        return False
    for pattern in _FRACTIONS:
        found = pattern.match(answer.strip())
        if found:
            return math.gcd(int(found[1]), int(found[2])) != 1
    return False


def correct(episode: looprl.EpisodeResult) -> float:
    """1.0 when math-verify finds the final answer equivalent to the reference.

    A task that asks for a reduced fraction gets 0.0 for an unreduced one (math-verify alone
    would accept 14/24 for 7/12, so the reduction could be skipped), and a numeric reference
    needs a number, not an expression (math-verify would evaluate the question's own `3/4 + 5/6`
    copied into the box).
    """
    if "sandbox_error" in python_statuses(episode):
        raise SandboxFailure("the sandbox failed during this episode (status sandbox_error)")
    got = final_answer(episode)
    if got is None or episode.task.answer is None:
        return 0.0
    if not_in_lowest_terms(episode.task.prompt[-1].content, got):
        return 0.0
    if _is_number(episode.task.answer) and not _is_number(got):
        return 0.0  # math-verify would evaluate `3/4 + 5/6` copied from the question
    from math_verify import parse, verify

    gold = parse(f"${episode.task.answer}$")
    pred = parse(f"${got}$")
    return float(bool(gold) and bool(pred) and verify(gold, pred))


def first_call_hint(tool: str) -> looprl.HintFunction:
    """The hint: a first call of `tool` already made for the model, running the task's code
    (`info["code"]`, which prints the answer), with the sandbox's reply to it (the task's answer
    printed). The model has only to read the result and box it. None for a task without code
    (your own dataset's, unless its rows carry `info.code`)."""

    def hint(task: looprl.Task, rng: random.Random) -> looprl.Hint | None:
        code = task.info.get("code")
        if not isinstance(code, str) or task.answer is None:
            return None
        reply = looprl.format_result(looprl.ExecResult("ok", stdout=f"{task.answer}\n"))
        return looprl.tool_call_hint(tool, {"code": code}, reply)

    return hint


def used_python(episode: looprl.EpisodeResult) -> float:
    """1.0 when the episode ran code at least once (metric)."""
    return float(bool(python_statuses(episode)))


def code_errors(episode: looprl.EpisodeResult) -> float:
    """Calls whose code failed (error, timeout, memory, output limit, killed) (metric)."""
    return float(sum(s not in ("ok", "sandbox_error") for s in python_statuses(episode)))


def load_environment(
    dataset: str | None = None,
    eval_dataset: str | None = None,
    columns: dict[str, Any] | None = None,
    session: bool = True,
    backend: str = "auto",
    max_turns: int = 6,
    max_tokens_per_turn: int = 384,
    max_context_tokens: int = 4096,
    hint_style: str = "call",
    **kwargs: Any,
) -> looprl.ToolEnv:
    """The python_math environment.

    `hint_style`: the hint a training task may get under `[hints]` or in `looprl bootstrap`'s
    rationalisation: `call`, the code that prints the answer already run for the model
    (`first_call_hint`); `answer`, the answer in a note, and `call_answer`, the call then a note
    saying how to box its output, for the bootstrap's rationalisation only (it fine-tunes on the
    reply without the note; RL would reward copying it).

    `dataset` (and `eval_dataset`): your own problems instead of the generated ones, a file or a
    saved `datasets` directory read by `looprl.train_eval_tasks` (default columns
    `question` or `prompt`, `answer`, `id`; `columns` maps others). Without `eval_dataset`, one
    problem in five of `dataset` (by a hash of its text) is held out for evaluation.
    """
    hints = {
        "call": first_call_hint("python_session" if session else "python"),
        "answer": looprl.answer_note(ANSWER_HINT),
    }
    hints["call_answer"] = looprl.then_note(hints["call"], CALL_ANSWER_HINT)
    if hint_style not in hints:
        raise ValueError(f"python_math hint_style={hint_style!r}: choose one of {sorted(hints)}")
    train, evals = looprl.train_eval_tasks(
        dataset, eval_dataset, env="python_math", columns=columns
    ) or (
        lambda n, seed: generate_tasks("train", n, seed),
        lambda n, seed: generate_tasks("eval", n, seed),
    )
    executor = looprl.make_executor(backend)
    python, python_session = looprl.make_python_tools(executor)

    class PythonMathEnv(looprl.ToolEnv):
        """Opens a sandbox session per episode and closes it at the end."""

        async def setup_state(self, task: looprl.Task) -> dict[str, Any]:
            return {"task": task, looprl.SESSION_KEY: looprl.new_session_id()}

        async def cleanup_state(self, state: dict[str, Any]) -> None:
            if looprl.SESSION_KEY in state:
                await executor.close_session(state[looprl.SESSION_KEY])

    env = PythonMathEnv(
        name="python_math",
        tools=[python_session if session else python],
        tool_timeout=30.0,
        rubric=looprl.Rubric([correct, used_python, code_errors], weights=[1.0, 0.0, 0.0]),
        train_tasks=train,
        eval_tasks=evals,
        limits=looprl.Limits(
            max_turns=max_turns,
            max_tokens_per_turn=max_tokens_per_turn,
            max_context_tokens=max_context_tokens,
        ),
        system_prompt=kwargs.pop("system_prompt", SYSTEM_PROMPT),
        hint=kwargs.pop("hint", hints[hint_style]),
        **kwargs,
    )
    env.sandbox = executor  # type: ignore[attr-defined]
    return env
