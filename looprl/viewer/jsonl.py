"""Incremental byte-offset indexes over JSONL files that may still be growing (metrics, rollouts).

A file is never loaded whole: each index remembers how far it has read and, on `refresh`, reads
only the complete lines added since (a trailing line without a newline is a line still being
written and is left for later). A complete line that is not a valid record is skipped and
counted: not UTF-8, not JSON, nested too deep, or (for episodes) not the shape
`looprl.viewer.schema` describes. Episode files keep only a few numbers per line (offset, length,
line number, reward, flags, interned task and environment ids), so memory stays small however
many episodes a run holds. The index parses only the head and tail of an episode line; damage in
its middle (messages, token arrays) is found when the line is first read for a page, and from
then on the line is skipped and counted like the others.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from looprl.trainer.metrics import upgrade_row
from looprl.viewer.schema import episode_problem

# Episode flags (one byte per episode).
FLAG_ERROR = 1  # `errors` is non-empty (rollout or scoring error)
FLAG_TOOL_ERROR = 2  # at least one failed tool call
FLAG_TRUNCATED = 4  # the episode hit a length or turn limit
FLAG_MALFORMED = 8  # reading the whole line showed it is not a valid episode: skipped
FLAG_CHECKED = 16  # the whole line was read once and is valid (no need to check it again)

# What a bad line raises while it is parsed or checked (UnicodeDecodeError is a ValueError;
# RecursionError comes from JSON nested about a thousand levels deep).
LINE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError)

_TASK_START = re.compile(r'\s*\{\s*"task"\s*:\s*')
_DECODER = json.JSONDecoder()
MAX_NOTED_LINES = 20  # how many malformed line numbers are kept for the notice


class MalformedRow(ValueError):
    """A line of a run file that is not a valid record (the API answers 400 with the reason)."""


def parse_line(line: bytes) -> Any:
    """The JSON value of one line; ValueError when it is not UTF-8 or not JSON (or too deep)."""
    try:
        return json.loads(line.decode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested too deep to parse") from None


class Interner:
    """Maps strings (task ids, environment names) to small ints, shared by all files of a run."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []
        self._lock = threading.Lock()

    def code(self, name: str) -> int:
        """The int for `name`, allocating one on first sight."""
        c = self.ids.get(name)
        if c is None:
            with self._lock:
                c = self.ids.get(name)
                if c is None:
                    c = len(self.names)
                    self.names.append(name)
                    self.ids[name] = c
        return c


class JsonlIndex:
    """Base class: reads complete new lines of one JSONL file and hands each to `_add`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.skipped = 0  # complete lines that were not valid records
        self.skipped_lines: list[int] = []  # 1-based line numbers of the first few skipped lines
        self.partial = False  # the file ends with a line still being written
        self._pos = 0  # byte offset of the first line not yet read
        self._lines = 0  # complete lines read so far (valid or not)
        self._ino: int | None = None

    def size(self) -> int:
        """Current size of the file in bytes (0 when it does not exist yet)."""
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0

    def refresh(self, budget_s: float | None = None) -> bool:
        """Index the lines added since the last call; True once the end of file is reached.

        With `budget_s`, stop after about that many seconds (callers page through what is
        ready and call again). A file that shrank or was replaced is indexed again from the start.
        """
        with self.lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                return True
            if self._ino is not None and (st.st_ino != self._ino or st.st_size < self._pos):
                self._reset()
            self._ino = st.st_ino
            if st.st_size == self._pos:
                self.partial = False
                return True
            return self._read_new(st.st_size, budget_s)

    def _read_new(self, size: int, budget_s: float | None) -> bool:
        deadline = None if budget_s is None else time.perf_counter() + budget_s
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            while True:
                line = f.readline()
                if not line:
                    self.partial = False
                    return True
                if not line.endswith(b"\n"):
                    self.partial = True  # still being written; read it next time
                    return True
                offset = self._pos
                self._pos += len(line)
                self._lines += 1
                if line.strip():
                    self._take(offset, line)
                if (
                    deadline is not None
                    and self._lines % 128 == 0
                    and time.perf_counter() > deadline
                ):
                    return self._pos >= size

    def _take(self, offset: int, line: bytes) -> None:
        try:
            self._add(offset, line)
        except LINE_ERRORS as e:
            self._note_skipped(self._lines, e)

    def _note_skipped(self, line_no: int, why: BaseException | str) -> None:
        self.skipped += 1
        if len(self.skipped_lines) < MAX_NOTED_LINES:
            self.skipped_lines.append(line_no)
            self.skipped_lines.sort()
        if self.skipped <= 3:
            why = str(why)[:300]
            print(f"looprl view: skipped line {line_no} of {self.path}: {why}", file=sys.stderr)

    def _reset(self) -> None:
        self.skipped = 0
        self.skipped_lines = []
        self.partial = False
        self._pos = 0
        self._lines = 0
        self._clear()

    def _add(self, offset: int, line: bytes) -> None:
        raise NotImplementedError

    def _clear(self) -> None:
        raise NotImplementedError

    def notice(self) -> dict[str, Any]:
        """What was skipped or is pending, for the API (`skipped`, `skipped_lines`, `partial`)."""
        return {
            "skipped": self.skipped,
            "skipped_lines": list(self.skipped_lines),
            "partial": self.partial,
        }


def finite(x: Any) -> float | None:
    """`x` as a float when it is a finite number (bools excluded), else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    try:
        f = float(x)
    except OverflowError:  # an integer beyond the float range
        return None
    return f if math.isfinite(f) else None


class MetricsFile(JsonlIndex):
    """`metrics.jsonl`: one row of numbers per training step, kept in memory (rows are small).

    A run written before the metric namespaces has its bare names renamed as rows are read
    (`looprl.trainer.metrics.upgrade_row`), so old and new runs chart side by side.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.rows: list[dict[str, float]] = []
        self.keys: set[str] = set()

    def _add(self, offset: int, line: bytes) -> None:
        obj = parse_line(line)
        if not isinstance(obj, dict):
            raise ValueError("metrics line is not a JSON object")
        row: dict[str, float] = {}
        for k, v in upgrade_row(obj).items():
            f = finite(v)
            if f is not None:
                row[str(k)] = f
        row.setdefault("step", float(len(self.rows)))
        self.keys.update(row)
        self.rows.append(row)

    def _clear(self) -> None:
        self.rows = []
        self.keys = set()

    def since(self, start: int) -> list[dict[str, float]]:
        """Rows from index `start` on (the client keeps what it already has)."""
        with self.lock:
            return self.rows[max(0, start) :]


def episode_summary(line: bytes) -> tuple[str, str, float, int]:
    """(task id, environment, reward, flags) of one `EpisodeResult.to_dict()` line.

    Fast path: parse only the `task` object at the head and the small tail that follows the
    token-level `trajectories` (the bulk of the line), which is about 20x cheaper than parsing the
    whole line. Falls back to a full parse when the line does not have the usual key order.
    The parsed parts are checked against `looprl.viewer.schema`. Raises ValueError when the line
    is not an episode.
    """
    text = line.decode("utf-8")
    try:
        summary = _fast_summary(text)
        if summary is None:
            obj = json.loads(text)
            if not isinstance(obj, dict) or not isinstance(obj.get("task"), dict):
                raise ValueError("line is not an episode (no `task` object)")
            summary = _summarize(obj["task"], obj)
    except RecursionError:
        raise ValueError("JSON nested too deep to parse") from None
    return summary


def _fast_summary(text: str) -> tuple[str, str, float, int] | None:
    m = _TASK_START.match(text)
    if m is None:
        return None
    try:
        task, end = _DECODER.raw_decode(text, m.end())
    except ValueError:
        return None
    traj = text.find('"trajectories":', end)
    if traj < 0:
        return None
    rew = text.find('"reward":', traj)
    if rew < 0 or not isinstance(task, dict):
        return None
    try:
        tail = json.loads("{" + text[rew:])
    except ValueError:
        return None
    if not isinstance(tail, dict) or "errors" not in tail:
        return None
    return _summarize(task, tail)


def _summarize(task: dict[str, Any], d: dict[str, Any]) -> tuple[str, str, float, int]:
    problem = episode_problem({**d, "task": task})
    if problem:
        raise ValueError(problem)
    reward = finite(d.get("reward"))
    flags = 0
    if d.get("errors"):
        flags |= FLAG_ERROR
    tool_errors = d.get("tool_errors") or {}
    if isinstance(tool_errors, dict) and any(v for v in tool_errors.values()):
        flags |= FLAG_TOOL_ERROR
    if d.get("truncated"):
        flags |= FLAG_TRUNCATED
    r = math.nan if reward is None else reward
    return str(task["id"]), str(task.get("env") or ""), r, flags


class EpisodeFile(JsonlIndex):
    """A rollouts or eval results file: per episode, where it is and what filters need."""

    def __init__(self, path: Path, tasks: Interner, envs: Interner) -> None:
        super().__init__(path)
        self._tasks = tasks
        self._envs = envs
        self._clear()

    def _clear(self) -> None:
        self.offsets = array("q")
        self.lengths = array("l")
        self.line_nos = array("l")
        self.malformed: dict[int, str] = {}  # episode index -> why, found when read
        self.rewards = array("d")
        self.flags = array("B")
        self.task_codes = array("l")
        self.env_codes = array("l")

    def __len__(self) -> int:
        return len(self.offsets)

    def usable(self) -> int:
        """Episodes indexed and not found malformed since."""
        with self.lock:
            return len(self.offsets) - len(self.malformed)

    def _add(self, offset: int, line: bytes) -> None:
        task_id, env, reward, flags = episode_summary(line)
        self.offsets.append(offset)
        self.lengths.append(len(line))
        self.line_nos.append(self._lines)
        self.rewards.append(reward)
        self.flags.append(flags)
        self.task_codes.append(self._tasks.code(task_id))
        self.env_codes.append(self._envs.code(env))

    def columns(self) -> dict[str, np.ndarray]:
        """Copies of the per-episode columns as numpy arrays (for vectorised filtering)."""
        with self.lock:
            return {
                "reward": np.array(self.rewards, dtype=np.float64),
                "flags": np.array(self.flags, dtype=np.uint8),
                "task": np.array(self.task_codes, dtype=np.int64),
                "env": np.array(self.env_codes, dtype=np.int64),
            }

    def read(self, i: int) -> dict[str, Any]:
        """Parse and check episode `i` (0-based among the lines the index took).

        Raises MalformedRow when the whole line is not a valid episode; the line is then
        skipped and counted from now on (see `FLAG_MALFORMED`).
        """
        with self.lock:
            if not 0 <= i < len(self.offsets):
                raise IndexError(f"episode {i} not in {self.path} (it has {len(self.offsets)})")
            if i in self.malformed:
                raise MalformedRow(self.malformed[i])
            offset, length, checked = self.offsets[i], self.lengths[i], self.flags[i] & FLAG_CHECKED
        with open(self.path, "rb") as f:
            f.seek(offset)
            raw = f.read(length)
        try:
            obj = parse_line(raw)
            problem = None if checked else episode_problem(obj)
        except LINE_ERRORS as e:
            problem = str(e)
        if problem:
            raise MalformedRow(self._mark_malformed(i, offset, problem))
        with self.lock:
            if self._same_line(i, offset):
                self.flags[i] |= FLAG_CHECKED
        return obj

    def _same_line(self, i: int, offset: int) -> bool:
        """Whether entry `i` still points at `offset` (False after a reset for a new file)."""
        return i < len(self.offsets) and self.offsets[i] == offset

    def _mark_malformed(self, i: int, offset: int, problem: str) -> str:
        with self.lock:
            if not self._same_line(i, offset):  # the file was replaced while we read it
                return f"episode {i} of {self.path.name}: {problem}"
            line_no = self.line_nos[i]
            why = f"line {line_no} of {self.path.name} is not a valid episode: {problem}"
            if i not in self.malformed:
                self.malformed[i] = why
                self.flags[i] |= FLAG_MALFORMED
                self._note_skipped(line_no, problem)
            return self.malformed[i]
