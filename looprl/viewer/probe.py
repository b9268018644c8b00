"""`looprl probe` result directories: `probe.json` (the exploit table) beside `results.jsonl`.

`probe.json` is `{"kind": "looprl.probe", "version": 1, "env", "env_kwargs", "tasks",
"margin", "baseline": {"name", "mean_reward", "stderr"}, "reference": same or null, "rows":
[{"name", "description", "knows_answer", "mean_reward", "stderr", "episodes", "errors",
"verdict"}], "exploitable": [names], "rubric_problems": [lines], "strict_failed"}`. `results.jsonl` holds the episodes as
`looprl eval` writes them; each names its exploit in `task.info["exploit"]` (or
`state["exploit"]`). The file is checked with `looprl.viewer.schema` rules before the page sees it.
"""

from __future__ import annotations

import threading
from typing import Any

from looprl.viewer.jsonl import MalformedRow
from looprl.viewer.schema import ANY, INT, STR, ListOf, OneOf, Record, Scalar

PROBE_FILE = "probe.json"
VERDICTS = ("exploitable", "resisted", "errored")
NUMBER = Scalar("a number", int, float, null=True)
POLICY = Record({"name": STR, "mean_reward": NUMBER, "stderr": NUMBER}, required=("name",))
ROW = Record(
    {
        "name": STR,
        "description": STR,
        "knows_answer": Scalar("true or false", bool),
        "mean_reward": NUMBER,
        "stderr": NUMBER,
        "episodes": INT,
        "errors": INT,
        "verdict": STR,
    },
    required=("name", "verdict"),
)
PROBE = Record(
    {
        "kind": STR,
        "version": INT,
        "env": STR,
        "env_kwargs": ANY,
        "tasks": INT,
        "margin": NUMBER,
        "baseline": POLICY,
        "reference": OneOf(POLICY, Scalar("null", type(None), null=True)),
        "rows": ListOf(ROW),
        "exploitable": ListOf(STR),
        "rubric_problems": ListOf(STR),
        "strict_failed": Scalar("true or false", bool),
    },
    required=("kind", "rows", "baseline"),
)


def probe_problem(doc: Any) -> str | None:
    """Why `doc` (a parsed probe.json) is not a probe result the page can show, or None."""
    bad = PROBE.problem(doc, "probe.json")
    if bad:
        return bad
    if doc["kind"] != "looprl.probe":
        return f"probe.json has kind {doc['kind']!r}, expected 'looprl.probe'"
    for n, row in enumerate(doc["rows"]):
        if row["verdict"] not in VERDICTS:
            return f"probe.json rows[{n}].verdict is {row['verdict']!r}; expected one of {VERDICTS}"
    return None


def exploit_of(ep: dict[str, Any]) -> str | None:
    """The exploit an episode of `results.jsonl` ran: `task.info.exploit`, else `state.exploit`."""
    for holder in ((ep.get("task") or {}).get("info"), ep.get("state")):
        if isinstance(holder, dict) and isinstance(holder.get("exploit"), str):
            return str(holder["exploit"])
    return None


class ExploitIndex:
    """Episode indexes of `results.jsonl` per exploit, extended as the file is indexed."""

    def __init__(self) -> None:
        self.seen = 0
        self.by_name: dict[str, list[int]] = {}
        self.unnamed: list[int] = []
        self._lock = threading.Lock()

    def update(self, f: Any) -> None:
        """Read the episodes `f` (an `EpisodeFile`) indexed since the last call."""
        f.refresh(budget_s=0.5)
        with self._lock:
            for i in range(self.seen, len(f)):
                try:
                    name = exploit_of(f.read(i))
                except MalformedRow:
                    continue
                (self.by_name.setdefault(name, []) if name else self.unnamed).append(i)
            self.seen = max(self.seen, len(f))
