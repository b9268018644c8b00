"""Small environments written in the verifiers 0.1 API (not looprl's), for tests/test_foreign_envs.py.

`load_environment(kind=...)` returns one of: `single` (a SingleTurnEnv scored by reply length, so
a random tiny model's samples differ), `tool` (a ToolEnv with an `add` tool and an exact-answer
reward), `game` (a MultiTurnEnv: guess a number, with feedback turns, a custom stop condition and
a final_env_response), `text_prompt` (a `prompt` column of strings), `raising` (a reward that
raises), `stateful` and `completion` (APIs the adapter refuses).
"""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def reply_length(completion, **kwargs) -> float:
    """Characters of the last assistant reply, scaled to [0, 1]."""
    text = [m["content"] for m in completion if m["role"] == "assistant"][-1] or ""
    return min(len(text), 100) / 100


def exact_answer(completion, answer) -> float:
    """1.0 when the last assistant message says the reference answer."""
    last = [m for m in completion if m["role"] == "assistant"][-1]
    return float(last["content"].strip() == f"The answer is {answer}.")


def guessed(state) -> float:
    """1.0 when the game state says the number was found."""
    return float(state.get("found", False))


def feedback_turns(completion) -> float:
    """User turns in the completion (the game's feedback and its final message)."""
    return float(sum(m["role"] == "user" for m in completion))


def group_rank(completions) -> list[float]:
    """A group reward: 1.0 for the longest completion of the group, else 0.0."""
    sizes = [len(c) for c in completions]
    return [float(s == max(sizes)) for s in sizes]


def broken(completion) -> float:
    """A reward that always raises."""
    raise RuntimeError("broken reward")


class GuessGame(vf.MultiTurnEnv):
    """Guess the secret number (in `info`); the env answers higher/lower until it is found."""

    async def setup_state(self, state, **kwargs):
        """Start with no guesses."""
        state["guesses"] = 0
        return state

    @vf.stop
    async def out_of_guesses(self, state) -> bool:
        """A stop condition of the game's own: two wrong guesses answered are enough."""
        return state.get("guesses", 0) >= 2

    async def env_response(self, messages, state, **kwargs):
        """Higher / lower feedback; a right guess sets the final response."""
        state["guesses"] += 1
        guess = messages[-1]["content"].strip()
        secret = str(state["info"]["secret"])
        if guess == secret:
            state["found"] = True
            state["final_env_response"] = [{"role": "user", "content": "Correct!"}]
            return state["final_env_response"]
        hint = "higher" if guess.isdigit() and int(guess) < int(secret) else "lower"
        return [{"role": "user", "content": f"{guess} is wrong, go {hint}."}]


def _rows(n: int) -> Dataset:
    return Dataset.from_list(
        [{"question": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)} for i in range(n)]
    )


def load_environment(kind: str = "single", n: int = 4) -> vf.Environment:
    """One of the test environments above (see the module docstring)."""
    if kind == "single":
        rubric = vf.Rubric(funcs=[reply_length], weights=[1.0])
        return vf.SingleTurnEnv(
            dataset=_rows(n), rubric=rubric, system_prompt="Say something.",
            sampling_args={"max_tokens": 12},
        )  # fmt: skip
    if kind in ("tool", "raising"):
        funcs = [exact_answer] + ([broken] if kind == "raising" else [])
        rubric = vf.Rubric(funcs=funcs, weights=[1.0] * len(funcs))
        return vf.ToolEnv(
            dataset=_rows(n), tools=[add], rubric=rubric, max_turns=3,
            system_prompt="Use the add tool, then say 'The answer is N.'",
        )  # fmt: skip
    if kind == "game":
        rows = [{"question": "Guess my number (1-9).", "answer": "", "info": {"secret": 3 + i}}
                for i in range(n)]  # fmt: skip
        rubric = vf.Rubric(funcs=[guessed, feedback_turns, group_rank], weights=[1.0, 0.0, 0.5])
        return GuessGame(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=4)
    if kind == "stateful":
        return vf.StatefulToolEnv(dataset=_rows(n), tools=[add])
    if kind == "text_prompt":  # a `prompt` column of strings in a chat environment
        rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(n)]
        rubric = vf.Rubric(funcs=[reply_length], weights=[1.0])
        return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=rubric)
    if kind == "completion":
        return vf.SingleTurnEnv(
            dataset=Dataset.from_list([{"prompt": "1 + 1 =", "answer": "2"}]),
            message_type="completion",
        )
    raise ValueError(f"unknown kind {kind!r}")
