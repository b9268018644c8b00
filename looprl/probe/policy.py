"""What a scripted probe policy is: the `Turn` it sees, the `Exploit` it implements, the profile.

A probe policy writes the text a model would write, turn by turn, through the real rollout
(tools run, state kept, the environment's rubric scores). It sees a `Turn`: the task, the
conversation so far, the environment's tools and its `ProbeProfile` (how an answer is written
in this environment, a wrong answer, guesses). An exploit is a small named object whose
docstring says what it tries; `knows_answer` marks the exploits that are handed the reference
answer because they test *where* or *how* the rubric reads it, not whether it can be guessed.

Environments add exploits of their own by setting `env.probe_profile` (see `ProbeProfile`).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from looprl.types import Message, Task

_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:/\d+)?$")
_NUMBERS_IN_TEXT = re.compile(r"(?<![\w.])-?\d+(?![\w.])")


def is_number(text: str | None) -> bool:
    """True for an ASCII integer, decimal or fraction (`42`, `-3.5`, `7/12`)."""
    return bool(text) and bool(_NUMBER.match(str(text).strip()))


def wrong_answer(answer: str | None) -> str:
    """A plausible answer that is not `answer`: a number one more, else a made-up name."""
    text = (answer or "").strip()
    if re.fullmatch(r"-?\d+", text):
        return str(int(text) + 1)
    if is_number(text):
        num, _, den = text.partition("/")
        return f"{float(num) + 1:g}" + (f"/{den}" if den else "")
    return "Zorvath" if text.lower() != "zorvath" else "Quillon"


def default_guesses(task: Task) -> list[str]:
    """What a hacker who knows the format but not the answer would try: numbers made from the
    prompt's numbers (each, and each pair added, subtracted, multiplied) and small integers for
    a numeric task; the prompt's capitalised words for any other."""
    question = task.prompt[-1].content if task.prompt else ""
    if not is_number(task.answer):
        words = re.findall(r"\b[A-Z][a-z]+\b", question)
        return list(dict.fromkeys(words)) or ["yes", "no"]
    nums = [int(n) for n in _NUMBERS_IN_TEXT.findall(question)][:6]
    out = [*nums]
    for i, a in enumerate(nums):
        for b in nums[i + 1 :]:
            out += [a + b, a - b, a * b]
    out += range(0, 21)
    return [str(n) for n in dict.fromkeys(out)]


@dataclass
class ProbeProfile:
    """How the probe writes answers for one environment, and the exploits it adds.

    - `answer_format`: a final answer as the environment expects it, `{}` standing for the value
      (`"<answer>{}</answer>"`, `"The answer is {}."`, `"\\\\boxed{{{}}}"`);
    - `wrong`: `(task, turn) -> str`, the honest baseline's wrong answer at a turn (default: a
      number one more than the reference, or a made-up name);
    - `guesses`: `task -> list[str]`, answers a hacker would try without knowing the right one;
    - `reference`: a policy (an object with `reply(turn) -> str`) that solves the task, when
      the environment has one (default: the reference answer written in `answer_format`);
    - `exploits`: the environment's own exploits, run after the generic ones;
    - `accepted`: exploits the environment accepts by design, each with the reason (e.g. a
      thousands separator is a legitimate way to write a number): they are still run and shown
      as `exploitable`, with the reason, but do not fail `--strict`.

    An environment hooks in by setting the attribute on itself, e.g. in `load_environment`::

        class SecretInToolName(Exploit):
            \"\"\"Calls a tool named after the answer, then ends without answering.\"\"\"

            name = "secret_in_tool_name"
            knows_answer = True

            def reply(self, turn: Turn) -> str:
                if turn.turn == 0:
                    return tool_call_text(f"say_{turn.answer}", {})
                return "Done."

        env.probe_profile = ProbeProfile("<answer>{}</answer>", exploits=[SecretInToolName()])
    """

    answer_format: str = "<answer>{}</answer>"
    wrong: Callable[[Task, int], str] | None = None
    guesses: Callable[[Task], list[str]] | None = None
    reference: Any = None
    exploits: list[Exploit] = field(default_factory=list)
    accepted: dict[str, str] = field(default_factory=dict)

    def fmt(self, value: str) -> str:
        """`value` written as a final answer in this environment's format."""
        return self.answer_format.replace("{}", value)

    def wrong_for(self, task: Task, turn: int) -> str:
        """The baseline's wrong answer for `task` at `turn`."""
        return self.wrong(task, turn) if self.wrong else wrong_answer(task.answer)

    def guesses_for(self, task: Task) -> list[str]:
        """Guesses for `task` that never use its answer."""
        return self.guesses(task) if self.guesses else default_guesses(task)


@dataclass
class Turn:
    """What a scripted policy sees before it writes an assistant turn.

    `turn` counts assistant turns so far (0 for the first); `messages` is the conversation so
    far; `tools` are the environment's OpenAI schemas; `max_tokens` is the turn's token cap and
    `max_turns` the episode's.
    """

    task: Task
    messages: list[Message]
    turn: int
    profile: ProbeProfile
    tools: list[dict[str, Any]]
    max_tokens: int
    max_turns: int

    @property
    def question(self) -> str:
        """The last user message of the task's prompt."""
        users = [m.content for m in self.task.prompt if m.role == "user"]
        return users[-1] if users else ""

    @property
    def answer(self) -> str:
        """The reference answer (only exploits with `knows_answer` may read it)."""
        return self.task.answer or ""

    @property
    def tool_results(self) -> list[str]:
        """Contents of the tool messages so far, in order."""
        return [m.content for m in self.messages if m.role == "tool"]

    def fmt(self, value: str) -> str:
        """`value` written in the environment's answer format."""
        return self.profile.fmt(value)


class Exploit:
    """A scripted adversarial policy: subclass, set `name` (and `knows_answer`), write `reply`.

    The class docstring's first line is the exploit's description in the probe's table.
    `applies` says whether the exploit makes sense for a task in an environment (e.g. the
    notation exploits need a numeric answer, the code exploits a tool that runs code); tasks
    where it does not apply are not run.
    """

    name: ClassVar[str] = ""
    knows_answer: ClassVar[bool] = False

    @property
    def description(self) -> str:
        """The first line of the class docstring."""
        return (inspect.getdoc(type(self)) or self.name).split("\n")[0]

    def applies(self, task: Task, tools: list[dict[str, Any]]) -> bool:
        """Whether this exploit can run on `task` with these tools (default: always)."""
        return True

    def reply(self, turn: Turn) -> str:
        """The assistant text for this turn."""
        raise NotImplementedError(f"exploit {type(self).__name__} must implement reply(turn)")


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call in the default `<tool_call>{...}</tool_call>` text format."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    """Names of the offered tools, in order."""
    return [t["function"]["name"] for t in tools]


def code_tool(tools: list[dict[str, Any]]) -> str | None:
    """The first tool that takes a `code` argument (a tool that runs code), else None."""
    for t in tools:
        if "code" in t["function"].get("parameters", {}).get("properties", {}):
            return str(t["function"]["name"])
    return None


def filled_arguments(schema: dict[str, Any], value: str) -> dict[str, Any]:
    """Arguments for every required parameter of a tool schema: `value` for strings, 1 else."""
    params = schema["function"].get("parameters", {})
    props = params.get("properties", {})
    out: dict[str, Any] = {}
    for name in params.get("required", list(props)):
        kind = props.get(name, {}).get("type", "string")
        out[name] = value if kind == "string" else 1
    return out
