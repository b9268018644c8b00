"""The shape of one episode line (`EpisodeResult.to_dict()`), checked before the page sees it.

A run directory is data from elsewhere: a line may have been written by another tool, cut short,
edited by hand or crafted. The page only ever receives episodes that pass `episode_problem`, so
its code can trust the types (a list is a list, a count is a number). The rules follow
`looprl.types` and are lenient where the writers differ: only `task` (with an `id`) and each
message's `role` are required, a task's `prompt` may be a plain string, optional strings may be
null, free-form fields (`info`, `metrics`, `state`, tool arguments) may hold any JSON nested at
most `MAX_DEPTH` deep. NaN, infinities and integers too large for a float are numbers here (the
server sends them as null); a token id must fit in 31 bits (every tokenizer's vocabulary does).
A run's JSON files (`config.json`, `metadata.json`) are read by `read_json` under the free-form rule.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_DEPTH = 64  # nesting allowed in free-form fields; deeper lines are skipped as malformed
MAX_TOKEN_ID = 2**31 - 1


class Spec:
    """One rule: `problem(x, where)` says what is wrong with `x`, or None when it fits."""

    def problem(self, x: Any, where: str) -> str | None:
        """Why `x` (found at `where`, e.g. `messages[2].content`) breaks the rule, else None."""
        raise NotImplementedError


def _kind(x: Any) -> str:
    return "null" if x is None else type(x).__name__


class Scalar(Spec):
    """A value of one of `types`; `bool` never counts as a number."""

    def __init__(self, name: str, *types: type, null: bool = False) -> None:
        self.name, self.types, self.null = name, types, null

    def problem(self, x: Any, where: str) -> str | None:
        """See `Spec.problem`."""
        if x is None and self.null:
            return None
        if isinstance(x, bool) and bool not in self.types:
            return f"{where} is {_kind(x)}, expected {self.name}"
        return None if isinstance(x, self.types) else f"{where} is {_kind(x)}, expected {self.name}"


class AnyJson(Spec):
    """Any JSON value nested at most `MAX_DEPTH` deep (checked without recursion)."""

    def problem(self, x: Any, where: str) -> str | None:
        """See `Spec.problem`."""
        stack = [(x, 0)]
        while stack:
            v, depth = stack.pop()
            if depth > MAX_DEPTH:
                return f"{where} is nested more than {MAX_DEPTH} levels deep"
            if isinstance(v, dict):
                stack += [(c, depth + 1) for c in v.values()]
            elif isinstance(v, list):
                stack += [(c, depth + 1) for c in v]
        return None


class ListOf(Spec):
    """A list whose items all fit `item`."""

    def __init__(self, item: Spec) -> None:
        self.item = item

    def problem(self, x: Any, where: str) -> str | None:
        """See `Spec.problem`."""
        if not isinstance(x, list):
            return f"{where} is {_kind(x)}, expected a list"
        for n, v in enumerate(x):
            bad = self.item.problem(v, f"{where}[{n}]")
            if bad:
                return bad
        return None


class MapOf(Spec):
    """An object whose values all fit `value` (keys are strings in JSON)."""

    def __init__(self, value: Spec) -> None:
        self.value = value

    def problem(self, x: Any, where: str) -> str | None:
        """See `Spec.problem`."""
        if not isinstance(x, dict):
            return f"{where} is {_kind(x)}, expected an object"
        for k, v in x.items():
            bad = self.value.problem(v, f"{where}.{k}")
            if bad:
                return bad
        return None


class Numbers(Spec):
    """A list of numbers, checked at C speed (token arrays hold tens of thousands)."""

    def __init__(self, *types: type, lo: int | None = None, hi: int | None = None) -> None:
        self.types, self.lo, self.hi = set(types), lo, hi
        self.name = " or ".join(sorted(t.__name__ for t in types))

    def problem(self, x: Any, where: str) -> str | None:
        """See `Spec.problem`."""
        if not isinstance(x, list):
            return f"{where} is {_kind(x)}, expected a list"
        odd = set(map(type, x)) - self.types
        if odd:
            found = ", ".join(sorted(t.__name__ for t in odd))
            return f"{where} holds {found}, expected only {self.name}"
        if x and self.lo is not None and min(x) < self.lo:
            return f"{where} holds {min(x)}, below {self.lo}"
        if x and self.hi is not None and max(x) > self.hi:
            return f"{where} holds a number above {self.hi}"
        return None


class Record(Spec):
    """An object with typed `fields` (each checked when present) and `required` keys."""

    def __init__(self, fields: dict[str, Spec], required: tuple[str, ...] = ()) -> None:
        self.fields, self.required = fields, required

    def problem(self, x: Any, where: str) -> str | None:
        """See `Spec.problem`."""
        if not isinstance(x, dict):
            return f"{where or 'the line'} is {_kind(x)}, expected an object"
        for key in self.required:
            if key not in x:
                return f"{where or 'the line'} has no {key!r}"
        for key, spec in self.fields.items():
            if key in x:
                bad = spec.problem(x[key], f"{where}.{key}" if where else key)
                if bad:
                    return bad
        return None


class OneOf(Spec):
    """Fits when any of `specs` fits; the problem reported is the first one's."""

    def __init__(self, *specs: Spec) -> None:
        self.specs = specs

    def problem(self, x: Any, where: str) -> str | None:
        """See `Spec.problem`."""
        problems = [spec.problem(x, where) for spec in self.specs]
        return None if None in problems else problems[0]


ANY = AnyJson()
STR = Scalar("a string", str)
OPT_STR = Scalar("a string", str, null=True)
INT = Scalar("an integer", int)
OPT_NUMBER = Scalar("a number", int, float, null=True)
OPT_BOOL = Scalar("true or false", bool, null=True)

TOOL_CALL = Record({"name": OPT_STR, "arguments": ANY, "id": OPT_STR, "raw": OPT_STR})
MESSAGE = Record(
    {
        "role": STR,
        "content": OPT_STR,
        "raw": OPT_STR,
        "name": OPT_STR,
        "tool_call_id": OPT_STR,
        "tool_calls": ListOf(TOOL_CALL),
    },
    required=("role",),
)
TASK = Record(
    {
        "id": Scalar("a string or an integer", str, int),
        "env": OPT_STR,
        "prompt": OneOf(ListOf(MESSAGE), STR),
        "answer": ANY,
        "info": ANY,
    },
    required=("id",),
)
TRAJECTORY = Record(
    {
        "token_ids": Numbers(int, lo=0, hi=MAX_TOKEN_ID),
        "mask": Numbers(int),
        "logprobs": Numbers(int, float),
        "turns": Numbers(int),
    }
)
ERROR = MapOf(ANY)
EPISODE = Record(
    {
        "task": TASK,
        "messages": ListOf(MESSAGE),
        "trajectories": ListOf(TRAJECTORY),
        "reward": OPT_NUMBER,
        "rewards": MapOf(OPT_NUMBER),
        "metrics": MapOf(ANY),
        "errors": ListOf(ERROR),
        "tool_errors": MapOf(OPT_NUMBER),
        "tool_outcomes": ListOf(MapOf(ANY)),
        "num_turns": INT,
        "num_tool_calls": INT,
        "truncated": OPT_BOOL,
        "stop_reason": OPT_STR,
        "timings": MapOf(OPT_NUMBER),
        "rollout_index": INT,
        "state": ANY,
    },
    required=("task",),
)


def episode_problem(ep: Any) -> str | None:
    """Why `ep` (a parsed line) is not an episode the page can show, or None when it is.

    Checks only the keys present besides `task`, so the head-and-tail dict the index parses
    (see `looprl.viewer.jsonl.episode_summary`) is checked with the same rules as a full line.
    """
    return EPISODE.problem(ep, "")


def read_json(path: Path) -> Any:
    """A JSON file's content, or None when it is missing, not (yet) valid JSON, or too deep."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return None if ANY.problem(doc, path.name) else doc
