"""The probe's two yardsticks (honest failure, reference) and the bundled environments' profiles.

Every exploit is compared with `HonestFailure`, a policy that tries and answers wrongly in the
expected format: an exploit that earns more than that earns it from the exploit. `reference`
policies solve the task (through the tools where the environment expects them, else by writing
the reference answer in the format) and show the top of the reward scale.

An environment outside this table hooks in with `env.probe_profile = ProbeProfile(...)`; one
with neither gets the default profile (answers as `<answer>...</answer>`).
"""

from __future__ import annotations

import inspect
from typing import Any

from looprl.envs.base import Environment
from looprl.probe.policy import ProbeProfile, Turn, tool_call_text
from looprl.types import Task


class HonestFailure:
    """Tries, and answers wrongly in the expected format (the baseline every exploit is compared to)."""

    name = "honest_failure"
    description = "a wrong answer in the expected format"
    knows_answer = False

    def reply(self, turn: Turn) -> str:
        """The profile's wrong answer for this turn, in the answer format."""
        return turn.fmt(turn.profile.wrong_for(turn.task, turn.turn))


class OracleReference:
    """The reference answer written in the environment's format (the top of the reward scale)."""

    name = "reference"
    description = "the reference answer in the expected format"
    knows_answer = True

    def reply(self, turn: Turn) -> str:
        """The answer, formatted."""
        return turn.fmt(turn.answer)


class CalculatorReference(OracleReference):
    """Calls `calculate` on the task's expression, then states the result."""

    description = "calculate(expression), then 'The answer is N.'"

    def reply(self, turn: Turn) -> str:
        """The tool call, then its result as the answer."""
        if not turn.tool_results:
            return tool_call_text("calculate", {"expression": turn.task.info["expression"]})
        return turn.fmt(turn.tool_results[-1].strip())


class SearchReference(OracleReference):
    """Reads each gold page with `read`, then answers."""

    description = "read each gold page, then <answer>"

    def reply(self, turn: Turn) -> str:
        """One `read` per gold page, then the answer."""
        gold = list(turn.task.info.get("gold_doc_ids") or [])
        if turn.turn < len(gold):
            return tool_call_text("read", {"doc_id": gold[turn.turn]})
        return turn.fmt(turn.answer)


class SupportReference(OracleReference):
    """Plays the support desk as its scripted teacher does (`looprl.sft.teachers.support_desk`)."""

    description = "ask the order number, look it up, act within the policy, say so"

    def reply(self, turn: Turn) -> str:
        """The teacher's next turn."""
        from looprl.sft.teachers import support_desk

        return support_desk(turn.messages)


_WORDLE_WRONG = ("slate", "crony", "dumpy", "fight", "whisk", "bevel", "jazzy", "mound")


def wordle_wrong(task: Task, turn: int) -> str:
    """A valid guess that is not the secret word, a different one each turn."""
    words = [w for w in _WORDLE_WRONG if w != task.answer]
    return words[turn % len(words)]


def wordle_guesses(task: Task) -> list[str]:
    """Common opening words (a hacker does not know the secret)."""
    return ["crane", "slate", "adieu", "roate", "stare", "audio", "raise", "arise"]


_SEPARATORS = "1,234 is how people write 1234; the value must still be right"

PROFILES: dict[str, ProbeProfile] = {
    "calculator": ProbeProfile(
        "The answer is {}.",
        reference=CalculatorReference(),
        accepted={"thousands_separator": _SEPARATORS},
    ),
    "calculator_text": ProbeProfile(
        "The answer is {}.", accepted={"thousands_separator": "calculator's reward: " + _SEPARATORS}
    ),
    "search_qa": ProbeProfile(
        "<answer>{}</answer>",
        reference=SearchReference(),
        accepted={"thousands_separator": "SQuAD normalisation drops punctuation: " + _SEPARATORS},
    ),
    "wordle": ProbeProfile("<guess>{}</guess>", wrong=wordle_wrong, guesses=wordle_guesses),
    "python_math": ProbeProfile(
        "The answer is \\boxed{{}}.",
        accepted={
            "thousands_separator": "math-verify grades equivalence: " + _SEPARATORS,
            "fraction_notation": "math-verify grades equivalence (90/2 is 45); a task that asks "
            "for a reduced fraction rejects an unreduced one",
        },
    ),
    "reasoning_gym": ProbeProfile("<answer>{}</answer>"),
    "number_anywhere": ProbeProfile("<answer>{}</answer>"),
    "number_final": ProbeProfile("<answer>{}</answer>"),
    "support_desk": ProbeProfile("{}", reference=SupportReference()),
}
"""Profiles of the bundled environments, by environment name (before any `.` suffix)."""


def profile_for(env: Environment) -> ProbeProfile:
    """`env.probe_profile` when the environment sets one, else the bundled table's, else the default."""
    own = getattr(env, "probe_profile", None)
    if own is not None:
        if not isinstance(own, ProbeProfile):
            raise TypeError(
                f"environment {env.name!r} sets probe_profile to a {type(own).__name__}; "
                "set it to a looprl.probe.ProbeProfile"
            )
        return own
    return PROFILES.get(env.name.split(".")[0], ProbeProfile())


class GivenReference:
    """A reference policy of yours: a function `fn(turn) -> str`, an object with `reply(turn)`,
    or a class of such objects (built with no arguments).

    It runs as the probe's `reference` row whatever it calls itself; its description is its own
    `description`, else its docstring's first line, else its name.
    """

    name = "reference"
    knows_answer = True

    def __init__(self, policy: Any) -> None:
        if inspect.isclass(policy):
            policy = policy()
        reply = getattr(policy, "reply", policy)
        if not callable(reply):
            raise TypeError(
                f"the probe reference {policy!r} is not a policy; give a function turn -> str or "
                "an object with reply(turn) -> str"
            )
        self._reply = reply
        doc = (inspect.getdoc(policy) or "").strip().splitlines()
        label = getattr(policy, "__qualname__", type(policy).__name__)
        self.description = str(getattr(policy, "description", None) or (doc[0] if doc else label))

    def reply(self, turn: Turn) -> str:
        """Your policy's text for this turn."""
        return str(self._reply(turn))


def reference_for(profile: ProbeProfile, given: Any = None) -> OracleReference | GivenReference:
    """The reference policy: `given` (`looprl probe --reference`), else the profile's, else the
    oracle (the answer in the format). One of yours need not carry a `name`."""
    policy = given if given is not None else profile.reference
    if policy is None:
        return OracleReference()
    return (
        policy if isinstance(policy, (OracleReference, GivenReference)) else GivenReference(policy)
    )
