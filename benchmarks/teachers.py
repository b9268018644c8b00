"""Scripted teachers that write SFT warm-start traces for the shipped environments.

    python -m benchmarks.teachers search_qa --n 160 --out runs/warm/search_qa.jsonl
    python -m benchmarks.teachers reasoning_gym --env.dataset basic_arithmetic --n 160 --out F

A small model that never produces an environment's format (a tool call, `<guess>`, `<answer>`)
gets reward 0 on every episode, so GRPO has no signal. These teachers play the environment
through the real rollout (a `ScriptedEngine` replying as the teacher would), so every tool
result in a trace is what the tool really returned; the episodes are scored by the
environment's own rubric and only those with reward above `--min-reward` are kept. The output
is JSONL for `looprl sft` ({"messages", "tools"} per line).

Teachers: search_qa (search a title, read the page, follow the link for 2 hops, answer),
wordle (guess the first word consistent with all feedback), python_math (write the code for the
problem's template, then box the printed result) and reasoning_gym (the reference answer in
`<answer>` tags, for any dataset: it teaches the format, not the reasoning).
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
from looprl.envs.registry import load_environment
from looprl.rollout import run_group
from looprl.types import EpisodeResult, Message, Task

Teacher = Callable[[Task, list[Message]], str]


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A tool call in the text format the renderer's parser reads."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _assistant_turns(messages: list[Message]) -> int:
    return sum(1 for m in messages if m.role == "assistant")


# --- search_qa ------------------------------------------------------------------------------


def search_qa_teacher(titles: dict[str, str]) -> Teacher:
    """Search each gold page by its title, read it, then answer; `titles` maps page id to title."""

    def reply(task: Task, messages: list[Message]) -> str:
        gold = list(task.info["gold_doc_ids"])
        turn = _assistant_turns(messages)
        if turn < 2 * len(gold):
            doc = gold[turn // 2]
            if turn % 2 == 0:
                return tool_call("search", {"query": titles[doc], "k": 3})
            return tool_call("read", {"doc_id": doc})
        return f"<answer>{task.answer}</answer>"

    return reply


# --- wordle ---------------------------------------------------------------------------------


def wordle_teacher(words: tuple[str, ...], first: str = "slate") -> Teacher:
    """Open with `first`, then guess the first target word consistent with all feedback so far."""
    from looprl.envs.wordle import score_guess

    _marks = re.compile(r"^([a-z]{5}) ([GY\-] ?){5}", re.IGNORECASE)

    def reply(task: Task, messages: list[Message]) -> str:
        history: list[tuple[str, str]] = []
        for m in messages:
            found = _marks.match(m.content) if m.role == "user" else None
            if found:
                word = found.group(1).lower()
                marks = m.content[6:].split("\n")[0].replace(" ", "")[:5]
                history.append((word, marks))
        if not history:
            return f"<guess>{first}</guess>"
        candidates = [
            w for w in words if all(score_guess(g, w).replace(" ", "") == s for g, s in history)
        ]
        return f"<guess>{candidates[0] if candidates else first}</guess>"

    return reply


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


def python_math_teacher(tool_name: str) -> Teacher:
    """Run the template's program with `tool_name`, then box what it printed."""

    def reply(task: Task, messages: list[Message]) -> str:
        results = [m.content for m in messages if m.role == "tool"]
        if not results:
            code = python_math_code(task.prompt[-1].content)
            if code is None:
                return "I cannot solve this one."
            return "Let me compute it.\n" + tool_call(tool_name, {"code": code})
        found = _STDOUT.search(results[-1])
        value = found.group(1).strip() if found else ""
        return f"The answer is \\boxed{{{value}}}."

    return reply


# --- reasoning_gym --------------------------------------------------------------------------


def answer_teacher(task: Task, messages: list[Message]) -> str:
    """The reference answer in `<answer>` tags (teaches the format only)."""
    return f"<answer>{task.answer}</answer>"


def make_teacher(env_name: str, env: Any, env_kwargs: dict[str, Any]) -> Teacher:
    """The teacher for a registered environment name (raises for one without a teacher)."""
    base = env_name.split(".")[0]
    if base == "search_qa":
        from looprl.envs.corpus import generate_world
        from looprl.envs.search_qa import load_corpus

        path = env_kwargs.get("corpus_path")
        docs = (
            load_corpus(path) if path else generate_world(env_kwargs.get("world_seed", 0)).documents
        )
        return search_qa_teacher({d.id: d.title for d in docs})
    if base == "wordle":
        from looprl.envs.wordle import word_lists

        return wordle_teacher(word_lists()[0])
    if base == "python_math":
        return python_math_teacher("python_session" if "python_session" in env.tools else "python")
    if base == "reasoning_gym":
        return answer_teacher
    raise ValueError(
        f"no teacher for environment {env_name!r}; teachers exist for search_qa, wordle, "
        "python_math and reasoning_gym"
    )


async def teacher_episodes(env: Any, teacher: Teacher, tasks: list[Task]) -> list[EpisodeResult]:
    """Play each task once with the teacher through the real rollout, scored by the rubric.

    Each task gets its own scripted engine (several tasks may share a prompt, as wordle's do).
    """

    async def play(task: Task) -> EpisodeResult:
        engine = ScriptedEngine(lambda request: teacher(task, request.messages))
        [episode] = await run_group(env, engine, task, 1, renderer=None)
        return episode

    return list(await asyncio.gather(*(play(t) for t in tasks)))


def sft_rows(env: Any, episodes: list[EpisodeResult], min_reward: float) -> list[dict[str, Any]]:
    """JSONL rows for `looprl sft` from the episodes whose reward is above `min_reward`."""
    rows = []
    for ep in episodes:
        if ep.errors or ep.reward is None or ep.reward <= min_reward:
            continue
        sub = env.for_task(ep.task)
        rows.append({"messages": [m.to_template() for m in ep.messages], "tools": sub.tool_schemas})
    return rows


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
    """Write teacher traces for an environment's training split."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("env", help="search_qa, wordle, python_math or reasoning_gym")
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
