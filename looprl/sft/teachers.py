"""Scripted teachers: policies that play the shipped environments, for evaluation and warm-start traces.

A policy is a plain function `fn(messages: list[Message]) -> str`: given the conversation so
far (system prompt, task, its own earlier turns, tool and environment replies), it returns the
next assistant text. The ones here read only the messages, so any of them can stand in for a
model: `looprl eval ENV --policy looprl.sft.teachers:NAME` evaluates one, and in Python
`ScriptedEngine(lambda request: policy(request.messages))` drives the real rollout with it.

| policy | environment | how it plays |
|---|---|---|
| `calculator` | calculator | calls `calculate` on the question's expression, copies the result |
| `search_qa` | search_qa (the generated world) | searches the question's subject, reads its page, follows the link for a second hop, answers |
| `wordle` | wordle | opens with "slate", then guesses the first answer word consistent with all feedback |
| `python_math` | python_math | runs the problem template's program with `python_session`, boxes what it printed |
| `basic_arithmetic` | reasoning_gym with `dataset=basic_arithmetic` | evaluates the expression (floor division, as reasoning-gym does), answers in `<answer>` tags |
| `support_desk` | support_desk | asks for the order number, looks the order up (and the refund policy), acts when the policy allows, says what it did |

A small model that never produces an environment's format (a tool call, `<guess>`, `<answer>`)
scores 0 on every episode, so GRPO has no signal: warm-start it by SFT on a teacher's traces.
The command line plays a teacher through the real rollout (every tool result in a trace is what
the tool returned), scores each episode with the environment's own rubric and keeps those above
`--min-reward`, as JSONL rows for `looprl sft --data` (`{"messages", "tools"}` per line):

    python -m looprl.sft.teachers search_qa --n 160 --out runs/warm/search_qa.jsonl
    python -m looprl.sft.teachers reasoning_gym --env.dataset basic_arithmetic --n 160 --out F

For trace writing, search_qa and reasoning_gym use teachers that read the task's reference
(`search_qa_gold_teacher`: the gold pages by title, for any corpus; `answer_teacher`: the
reference answer in tags, for any reasoning-gym dataset: it teaches the format, not the
reasoning). They need the task, so they are not policies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from looprl.engines.scripted import ScriptedEngine
from looprl.envs.arithmetic import safe_eval
from looprl.envs.base import Environment
from looprl.envs.registry import load_environment
from looprl.eval.run import traces_from_episodes
from looprl.rollout.loop import run_group
from looprl.types import EpisodeResult, Message, Task

Policy = Callable[[list[Message]], str]
"""The next assistant text from the conversation so far."""
TaskTeacher = Callable[[Task], Policy]
"""The policy that plays one task (a teacher may read the task's reference answer)."""

POLICIES = ("calculator", "search_qa", "wordle", "python_math", "basic_arithmetic", "support_desk")
"""Names of the policy functions in this module (`looprl.sft.teachers:NAME`)."""


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A tool call in the text format the default (Hermes) parser reads."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _question(messages: list[Message]) -> str:
    """The task's question: the first user message."""
    return next((m.content for m in messages if m.role == "user"), "")


def _tool_results(messages: list[Message], name: str | None = None) -> list[str]:
    return [m.content for m in messages if m.role == "tool" and (name is None or m.name == name)]


# --- calculator and basic_arithmetic ---------------------------------------------------------

_WHAT_IS = re.compile(r"What is (.+?)\?")
_CALCULATE = re.compile(r"Calculate (.+?)\.?\s*$")


def calculator(messages: list[Message]) -> str:
    """Calculator policy: `calculate` the question's expression, then "The answer is N."."""
    results = _tool_results(messages, "calculate")
    if results:
        return f"The answer is {results[-1]}."
    found = _WHAT_IS.search(_question(messages))
    if found is None:
        return "I cannot read this question."
    return tool_call("calculate", {"expression": found.group(1)})


def basic_arithmetic(messages: list[Message]) -> str:
    """reasoning_gym basic_arithmetic policy: the expression's value in `<answer>` tags.

    Division is floor division, as reasoning-gym computes its reference answers.
    """
    found = _CALCULATE.search(_question(messages).strip())
    if found is None:
        return "<answer>unknown</answer>"
    try:
        value = safe_eval(found.group(1).replace("/", "//"))
    except (ValueError, ZeroDivisionError):
        return "<answer>unknown</answer>"
    return f"<answer>{value}</answer>"


# --- search_qa ------------------------------------------------------------------------------

_FACTS = {  # a fact of a page of the generated world (looprl.envs.corpus)
    "year": re.compile(r"\(born (\d+)\)"),
    "job": re.compile(r"\) is an? (.+?) born in the city of "),
    "city": re.compile(r"born in the city of (.+?)\. "),
    "country": re.compile(r"is a city in (.+?) with about"),
    "capital": re.compile(r"Its capital is (.+?)\. "),
    "founded": re.compile(r"was founded in (\d+) by"),
    "founder": re.compile(r"was founded in \d+ by (.+?)\. Its headquarters"),
    "hq": re.compile(r"Its headquarters are in (.+?), and"),
}
_QUESTIONS = [  # question form -> the facts to follow, page by page (the last one answers)
    (re.compile(r"In which city was the founder of the (.+) born\?"), ("founder", "city")),
    (re.compile(r"In what year was the founder of the (.+) born\?"), ("founder", "year")),
    (re.compile(r"In which country are the headquarters of the (.+)\?"), ("hq", "country")),
    (re.compile(r"In what year was the (.+) founded\?"), ("founded",)),
    (re.compile(r"Who founded the (.+)\?"), ("founder",)),
    (re.compile(r"In which country is the city of (.+)\?"), ("country",)),
    (re.compile(r"In which country was (.+) born\?"), ("city", "country")),
    (re.compile(r"In which city was (.+) born\?"), ("city",)),
    (re.compile(r"In what year was (.+) born\?"), ("year",)),
    (re.compile(r"What is the profession of (.+)\?"), ("job",)),
    (re.compile(r"What is the capital of (.+)\?"), ("capital",)),
]
_HIT = re.compile(r"^\[([^\]]+)\] (.*?): ", re.MULTILINE)


def search_qa(messages: list[Message]) -> str:
    """search_qa policy for the generated world: search the subject, read its page, follow links.

    Each hop is a `search` for the entity's name and a `read` of the hit whose title is that
    name (else the first hit); the fact read on the last page is the answer.
    """
    question = _question(messages)
    plan = next(
        ((q.search(question), facts) for q, facts in _QUESTIONS if q.search(question)), None
    )
    if plan is None or plan[0] is None:
        return "<answer>unknown</answer>"
    subject, facts = plan[0].group(1), plan[1]
    pages, searches = _tool_results(messages, "read"), _tool_results(messages, "search")
    entity = subject
    for fact, page in zip(facts, pages, strict=False):
        found = _FACTS[fact].search(page)
        if found is None:
            return "<answer>unknown</answer>"
        entity = found.group(1)
    if len(pages) == len(facts):
        return f"<answer>{entity}</answer>"
    if len(searches) > len(pages):
        hits = _HIT.findall(searches[-1])
        if not hits:
            return "<answer>unknown</answer>"
        doc = next((d for d, title in hits if title == entity), hits[0][0])
        return tool_call("read", {"doc_id": doc})
    return tool_call("search", {"query": entity, "k": 3})


def search_qa_gold_teacher(titles: dict[str, str]) -> TaskTeacher:
    """Search each gold page by its title, read it, then answer; `titles` maps page id to title."""

    def for_task(task: Task) -> Policy:
        gold = list(task.info["gold_doc_ids"])

        def reply(messages: list[Message]) -> str:
            turn = sum(1 for m in messages if m.role == "assistant")
            if turn < 2 * len(gold):
                doc = gold[turn // 2]
                if turn % 2 == 0:
                    return tool_call("search", {"query": titles[doc], "k": 3})
                return tool_call("read", {"doc_id": doc})
            return f"<answer>{task.answer}</answer>"

        return reply

    return for_task


# --- wordle ---------------------------------------------------------------------------------

_MARKS = re.compile(r"^([a-z]{5}) ((?:[GY\-] ?){5})", re.IGNORECASE)


def wordle(messages: list[Message]) -> str:
    """Wordle policy: open with "slate", then the first answer word consistent with all feedback
    (the first of the environment's `Possible words:` when it lists them, `wordle(hint=K)`)."""
    from looprl.envs.wordle import listed_words, score_guess, word_lists

    listed = listed_words(messages[-1].content) if messages[-1].role == "user" else None
    if listed:
        return f"<guess>{listed[0]}</guess>"
    history: list[tuple[str, str]] = []
    for m in messages:
        found = _MARKS.match(m.content) if m.role == "user" else None
        if found:
            history.append((found.group(1).lower(), found.group(2).replace(" ", "")))
    if not history:
        return "<guess>slate</guess>"
    candidates = (
        w
        for w in word_lists()[0]
        if all(score_guess(g, w).replace(" ", "") == marks for g, marks in history)
    )
    return f"<guess>{next(candidates, 'slate')}</guess>"


# --- python_math ----------------------------------------------------------------------------

_PM_CODE: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    (
        re.compile(r"costs (\d+) cents\. \w+ buys (\d+) pens and pays with (\d+) cents"),
        lambda m: f"price = {m[1]}\ncount = {m[2]}\npaid = {m[3]}\nprint(paid - price * count)",
    ),
    (
        re.compile(r"remainder when (\d+)\^3 is divided by (\d+)"),
        lambda m: f"print({m[1]}**3 % {m[2]})",
    ),
    (
        re.compile(r"sum of the squares of the integers from 1 to (\d+)"),
        lambda m: f"print(sum(i * i for i in range(1, {m[1]} + 1)))",
    ),
    (
        re.compile(r"Compute (\d+)/(\d+) \+ (\d+)/(\d+) as a reduced fraction"),
        lambda m: (
            f"from fractions import Fraction\nprint(Fraction({m[1]}, {m[2]}) + Fraction({m[3]}, {m[4]}))"
        ),
    ),
    (
        re.compile(r"team of (\d+) be chosen from (\d+) people"),
        lambda m: f"import math\nprint(math.comb({m[2]}, {m[1]}))",
    ),
]
_STDOUT = re.compile(r"stdout:\n(.*?)(?:\n[a-z]+:|\Z)", re.DOTALL)


def python_math_code(question: str) -> str | None:
    """The teacher's program for a generated problem (None for a question of another form)."""
    for pattern, code in _PM_CODE:
        found = pattern.search(question)
        if found:
            return code(found)
    return None


def python_math_reply(messages: list[Message], tool_name: str) -> str:
    """Run the template's program with the tool `tool_name`, then box what it printed."""
    results = _tool_results(messages)
    if not results:
        code = python_math_code(_question(messages))
        if code is None:
            return "I cannot solve this one."
        return "Let me compute it.\n" + tool_call(tool_name, {"code": code})
    found = _STDOUT.search(results[-1])
    value = found.group(1).strip() if found else ""
    return f"The answer is \\boxed{{{value}}}."


def python_math(messages: list[Message]) -> str:
    """python_math policy (the default `session=True` environment, whose tool is `python_session`)."""
    return python_math_reply(messages, "python_session")


# --- traces ---------------------------------------------------------------------------------


# --- support_desk ---------------------------------------------------------------------------

_ORDER_NUMBER = re.compile(r"\bA\d{4}\b")
_NEW_ADDRESS = re.compile(r" to (.+?) instead\.")
_WINDOW = re.compile(r"within (\d+) days")


def support_desk(messages: list[Message]) -> str:
    """support_desk policy: ask for the order number, `lookup_order`, then per request: tell the
    tracking number; `refund_policy` and `refund` when delivered within the window; or
    `change_address` while the order is processing; then say what was done."""
    said = [m.content for m in messages if m.role == "user"]
    number = _ORDER_NUMBER.search(" ".join(said[1:]))
    if number is None:
        return "Could you give me your order number, please?"
    looked = _tool_results(messages, "lookup_order")
    if not looked:
        return tool_call("lookup_order", {"order_id": number.group()})
    order, opening = json.loads(looked[-1]), said[0]
    if "refund" in opening:
        return _support_refund(messages, order)
    new_address = _NEW_ADDRESS.search(opening)
    if new_address is None:
        return f"Your {order['item']} is {order['status']}; its tracking number is {order['tracking']}."
    if order["status"] != "processing":
        return f"Sorry, your {order['item']} has already {order['status']}, so I cannot change its address."
    if not _tool_results(messages, "change_address"):
        return tool_call(
            "change_address", {"order_id": order["order_id"], "new_address": new_address.group(1)}
        )
    return f"Done: your {order['item']} will be sent to {new_address.group(1)}."


def _support_refund(messages: list[Message], order: dict[str, Any]) -> str:
    """The refund turns: read the policy, refund when it allows, then say so."""
    policy = _tool_results(messages, "refund_policy")
    if not policy:
        return tool_call("refund_policy", {"category": order["category"]})
    window = _WINDOW.search(policy[-1])
    days = order["days_since_delivery"]
    if order["status"] != "delivered" or window is None or days > int(window.group(1)):
        return f"Sorry, your {order['item']} cannot be refunded under our policy: {policy[-1]}"
    if not _tool_results(messages, "refund"):
        return tool_call("refund", {"order_id": order["order_id"]})
    return f"Your {order['item']} (order {order['order_id']}) has been refunded."


def answer_teacher(task: Task) -> Policy:
    """The task's reference answer in `<answer>` tags (teaches a format, not the reasoning)."""
    return lambda messages: f"<answer>{task.answer}</answer>"


def make_teacher(env_name: str, env: Environment, env_kwargs: dict[str, Any]) -> TaskTeacher:
    """The trace teacher for a shipped environment name (ValueError for one without a teacher)."""
    base = env_name.split(".")[0]
    if base == "calculator":
        return lambda task: calculator
    if base == "search_qa":
        from looprl.envs.corpus import generate_world
        from looprl.envs.search_qa import load_corpus

        path = env_kwargs.get("corpus_path")
        docs = (
            load_corpus(path) if path else generate_world(env_kwargs.get("world_seed", 0)).documents
        )
        return search_qa_gold_teacher({d.id: d.title for d in docs})
    if base == "wordle":
        return lambda task: wordle
    if base == "python_math":
        name = "python_session" if "python_session" in getattr(env, "tools", {}) else "python"
        return lambda task: lambda messages: python_math_reply(messages, name)
    if base == "reasoning_gym":
        return answer_teacher
    if base == "support_desk":
        return lambda task: support_desk
    raise ValueError(
        f"no teacher for environment {env_name!r}; teachers exist for calculator, search_qa, "
        "wordle, python_math, reasoning_gym and support_desk (for another environment write a policy "
        "fn(messages) -> str and use teacher_episodes and sft_rows)"
    )


async def teacher_episodes(
    env: Environment, teacher: TaskTeacher, tasks: list[Task]
) -> list[EpisodeResult]:
    """Play each task once with its policy through the real rollout, scored by the rubric.

    Each task gets its own scripted engine (several tasks may share a prompt, as wordle's do).
    For a policy that ignores the task, pass `lambda task: policy`.
    """

    async def play(task: Task) -> EpisodeResult:
        policy = teacher(task)
        engine = ScriptedEngine(lambda request: policy(request.messages))
        [episode] = await run_group(env, engine, task, 1, renderer=None)
        return episode

    return list(await asyncio.gather(*(play(t) for t in tasks)))


def sft_rows(
    env: Environment, episodes: list[EpisodeResult], min_reward: float
) -> list[dict[str, Any]]:
    """`looprl sft` rows (`{"messages", "tools"}`) of the episodes without errors scoring above
    `min_reward` (strictly: `traces_from_episodes` keeps those reaching it)."""
    above = [ep for ep in episodes if ep.reward is not None and ep.reward > min_reward]
    return traces_from_episodes(env, above, min_reward)


def _env_kwargs(extra: list[str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    it = iter(extra)
    for key in it:
        if not key.startswith("--env."):
            raise SystemExit(f"unknown argument {key!r}; environment arguments are --env.KEY VALUE")
        raw = next(it, None)
        if raw is None:
            raise SystemExit(f"{key} needs a value")
        try:
            kwargs[key.removeprefix("--env.")] = json.loads(raw)
        except json.JSONDecodeError:
            kwargs[key.removeprefix("--env.")] = raw
    return kwargs


def main(argv: list[str] | None = None) -> int:
    """Write teacher traces of an environment's training split (exit 1 when none is kept)."""
    parser = argparse.ArgumentParser(
        prog="python -m looprl.sft.teachers", description="Write SFT warm-start traces."
    )
    parser.add_argument(
        "env", help="calculator, search_qa, wordle, python_math, reasoning_gym or support_desk"
    )
    parser.add_argument("--n", type=int, default=160, help="training tasks to play")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-reward", type=float, default=0.0, help="keep episodes above this")
    parser.add_argument("--out", type=Path, required=True)
    args, extra = parser.parse_known_args(argv)
    env_kwargs = _env_kwargs(extra)
    env = load_environment(args.env, **env_kwargs)
    teacher = make_teacher(args.env, env, env_kwargs)
    tasks = env.get_tasks("train", args.n, seed=args.seed)
    episodes = asyncio.run(teacher_episodes(env, teacher, tasks))
    rows = sft_rows(env, episodes, args.min_reward)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    rewards = [ep.reward or 0.0 for ep in episodes]
    print(
        f"{args.env}: {len(episodes)} teacher episodes, mean reward "
        f"{sum(rewards) / max(1, len(rewards)):.3f}; kept {len(rows)} -> {args.out}"
    )
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
