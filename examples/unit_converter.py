"""unit_converter: convert lengths and masses with a `lookup` tool whose findings a `convert` tool reuses.

The worked example of docs/authoring.md: tasks from a seeded generator, two tools sharing
per-episode state through a hidden argument, errors of the tools' own kinds (`ToolError`),
a status beside a tool's text (`ToolReply`), a rubric that reuses the evaluation function, and
`policy`, a scripted policy that plays it perfectly.

    looprl eval examples/unit_converter.py -n 20
"""

from __future__ import annotations

import json
import random
import re
from typing import Annotated, Any

from looprl import (
    EpisodeResult,
    Hidden,
    Limits,
    Message,
    Rubric,
    Task,
    ToolEnv,
    ToolError,
    ToolReply,
    final_reply,
    shown_outcomes,
    split_of,
    tool_calls,
)

# unit -> (dimension, size in the dimension's base unit: metres or grams)
UNITS = {
    "mm": ("length", 0.001),
    "cm": ("length", 0.01),
    "m": ("length", 1.0),
    "km": ("length", 1000.0),
    "in": ("length", 0.0254),
    "ft": ("length", 0.3048),
    "mi": ("length", 1609.344),
    "g": ("mass", 1.0),
    "kg": ("mass", 1000.0),
    "oz": ("mass", 28.349523125),
    "lb": ("mass", 453.59237),
}
BASE = {"length": "m", "mass": "g"}


def lookup(unit: str, known: Annotated[dict[str, float], Hidden("known")]) -> ToolReply:
    """Look up the size of a unit in metres (lengths) or grams (masses).

    Args:
        unit: A unit symbol, e.g. "km" or "lb".
    """
    if unit not in UNITS:
        raise ToolError(f"no such unit {unit!r}; known units: {', '.join(UNITS)}", kind="not_found")
    dimension, size = UNITS[unit]
    known[unit] = size
    return ToolReply(f"1 {unit} = {size:g} {BASE[dimension]}", status=dimension)


def convert(
    value: float, from_unit: str, to_unit: str, known: Annotated[dict[str, float], Hidden("known")]
) -> str:
    """Convert a value between two units you have looked up.

    Args:
        value: The number to convert.
        from_unit: The unit of `value`.
        to_unit: The unit to convert to.
    """
    missing = [u for u in (from_unit, to_unit) if u not in known]
    if missing:
        raise ToolError(f"look up {', '.join(missing)} first", kind="not_looked_up")
    if UNITS[from_unit][0] != UNITS[to_unit][0]:
        raise ToolError(f"cannot convert {from_unit} to {to_unit}", kind="incompatible")
    return f"{value * known[from_unit] / known[to_unit]:.4g}"


class UnitEnv(ToolEnv):
    """A tool environment whose episodes each start with nothing looked up."""

    async def setup_state(self, task: Task) -> dict[str, Any]:
        """The base state plus `known`, the units looked up so far (unit -> size)."""
        return {**await super().setup_state(task), "known": {}}


def make_tasks(split: str, n: int, seed: int) -> list[Task]:
    """`n` conversions of a split; a hash of the question sends one in five to `eval`."""
    rng = random.Random(f"units-{split}-{seed}")
    tasks: dict[str, Task] = {}
    while len(tasks) < n:
        dimension = rng.choice(sorted(BASE))
        source, target = rng.sample([u for u, (d, _) in UNITS.items() if d == dimension], 2)
        value = rng.randint(1, 999) / rng.choice([1, 10])
        question = f"Convert {value:g} {source} to {target}."
        if split_of(question) == split:
            answer = value * UNITS[source][1] / UNITS[target][1]
            prompt = [Message(role="user", content=question)]
            tasks[question] = Task(id=f"units-{value:g}-{source}-{target}", prompt=prompt,
                                   answer=f"{answer:.4g}", info={"dimension": dimension})  # fmt: skip
    return list(tasks.values())


def correct_answer(episode: EpisodeResult) -> float:
    """1.0 when 'The answer is X' is within 0.1% of the reference."""
    found = re.search(r"answer is\s*(-?[\d.]+(?:e[+-]?\d+)?)", final_reply(episode))
    if found is None or episode.task.answer is None:
        return 0.0
    reference = float(episode.task.answer)
    return float(abs(float(found.group(1).rstrip(".")) - reference) <= 1e-3 * abs(reference))


def lookups(episode: EpisodeResult) -> float:
    """Metric: `lookup` calls the model made."""
    return float(len(tool_calls(episode, "lookup")))


def own_errors(episode: EpisodeResult) -> float:
    """Metric: calls whose result the model saw failing with one of this environment's kinds."""
    kinds = {"not_found", "not_looked_up", "incompatible"}
    return float(sum(o.error_kind in kinds for o in shown_outcomes(episode)))


SYSTEM_PROMPT = (
    "Look up both units with the lookup tool, convert with the convert tool, then reply with "
    "'The answer is X.'"
)


def load_environment(max_turns: int = 5, **kwargs: Any) -> UnitEnv:
    """The unit_converter environment (reward: the converted value within 0.1%)."""
    return UnitEnv(
        name="unit_converter",
        tools=[lookup, convert],
        rubric=Rubric([correct_answer, lookups, own_errors], weights=[1.0, 0.0, 0.0]),
        train_tasks=lambda n, seed: make_tasks("train", n, seed),
        eval_tasks=lambda n, seed: make_tasks("eval", n, seed),
        limits=Limits(max_turns=max_turns, max_tokens_per_turn=128),
        system_prompt=SYSTEM_PROMPT,
        **kwargs,
    )


_QUESTION = re.compile(r"Convert (\S+) (\S+) to (\S+)\.")


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as a model writes it: the `<tool_call>` JSON block the default parser reads."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def policy(messages: list[Message]) -> str:
    """A scripted policy: look up both units (two calls in one turn), convert, copy the result."""
    found = _QUESTION.search(next(m.content for m in messages if m.role == "user"))
    if found is None:
        return "I cannot read this question."
    value, source, target = found.groups()
    results = [m for m in messages if m.role == "tool"]
    if not results:
        return tool_call("lookup", {"unit": source}) + tool_call("lookup", {"unit": target})
    if results[-1].name == "lookup":
        args = {"value": float(value), "from_unit": source, "to_unit": target}
        return tool_call("convert", args)
    return f"The answer is {results[-1].content}."
