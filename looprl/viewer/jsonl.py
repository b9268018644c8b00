"""Incremental byte-offset indexes over JSONL files that may still be growing (metrics, rollouts).

A file is never loaded whole: each index remembers how far it has read and, on `refresh`, reads
only the complete lines added since (a trailing line without a newline is a line still being
written and is left for later). A complete line that is not valid JSON is skipped and counted.
Episode files keep only a few numbers per line (offset, length, reward, flags, interned task and
environment ids), so memory stays small however many episodes a run holds.
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

# Episode flags (one byte per episode).
FLAG_ERROR = 1  # `errors` is non-empty (rollout or scoring error)
FLAG_TOOL_ERROR = 2  # at least one failed tool call
FLAG_TRUNCATED = 4  # the episode hit a length or turn limit

_TASK_START = re.compile(r'\s*\{\s*"task"\s*:\s*')
_DECODER = json.JSONDecoder()
MAX_NOTED_LINES = 20  # how many malformed line numbers are kept for the notice


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
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError) as e:
            self.skipped += 1
            if len(self.skipped_lines) < MAX_NOTED_LINES:
                self.skipped_lines.append(self._lines)
            if self.skipped <= 3:
                print(
                    f"looprl view: skipped line {self._lines} of {self.path}: {e}", file=sys.stderr
                )

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
    f = float(x)
    return f if math.isfinite(f) else None


class MetricsFile(JsonlIndex):
    """`metrics.jsonl`: one row of numbers per training step, kept in memory (rows are small)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.rows: list[dict[str, float]] = []
        self.keys: set[str] = set()

    def _add(self, offset: int, line: bytes) -> None:
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ValueError("metrics line is not a JSON object")
        row: dict[str, float] = {}
        for k, v in obj.items():
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
    Raises ValueError when the line is not an episode.
    """
    text = line.decode("utf-8")
    summary = _fast_summary(text)
    if summary is None:
        obj = json.loads(text)
        if not isinstance(obj, dict) or not isinstance(obj.get("task"), dict):
            raise ValueError("line is not an episode (no `task` object)")
        summary = _summarize(obj["task"], obj)
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
        self.rewards = array("d")
        self.flags = array("B")
        self.task_codes = array("l")
        self.env_codes = array("l")

    def __len__(self) -> int:
        return len(self.offsets)

    def _add(self, offset: int, line: bytes) -> None:
        task_id, env, reward, flags = episode_summary(line)
        self.offsets.append(offset)
        self.lengths.append(len(line))
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
        """Parse episode `i` (0-based among the valid episodes of this file)."""
        with self.lock:
            if not 0 <= i < len(self.offsets):
                raise IndexError(f"episode {i} not in {self.path} (it has {len(self.offsets)})")
            offset, length = self.offsets[i], self.lengths[i]
        with open(self.path, "rb") as f:
            f.seek(offset)
            raw = f.read(length)
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError(f"line at byte {offset} of {self.path} is not a JSON object")
        return obj
