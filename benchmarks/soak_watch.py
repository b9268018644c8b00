"""What the long soak reads from outside a running trainer, and its table per time window.

- `read_proc(pid)`: resident memory, open file descriptors and threads of a process, from
  `/proc/PID/status` and `/proc/PID/fd` (None once it has exited);
- `RunCounters`: steps done and those that updated the weights (`train/grad_norm` > 0 in
  `metrics.jsonl`), and the tool calls of the saved episodes
  (`rollouts/step_*.jsonl`, every episode saved when `trainer.save_rollouts` covers the batch):
  the model's invalid calls (malformed, unknown tool, bad arguments: answered by the executor,
  the tool never runs), and of the valid ones: made, answered (the tool returned or raised),
  timed out (hung past the tool timeout) and refused `unavailable` (no thread to run on);
- `windows(samples, window_s)`: one row per window of the run: what the counters gained in it,
  and the process's numbers at its end (and their highest in it);
- `format_table(rows)`: those rows as a text table.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from looprl.tools.executor import EXCEPTION, TIMEOUT, UNAVAILABLE
from looprl.trainer.logger import METRICS_FILE, read_metrics

COUNTERS = (
    "steps",
    "updates",
    "episodes",
    "invalid",
    "calls",
    "answered",
    "timeouts",
    "unavailable",
)
"""The cumulative counters of a `Sample`, in table order."""
ANSWERED = (None, EXCEPTION)
"""Outcomes of a valid call the tool answered: it returned (None) or raised."""


@dataclass(frozen=True)
class Proc:
    """A process's resources at one moment."""

    rss_mb: float
    """Resident memory (`VmRSS`), MiB."""
    fds: int
    """Open file descriptors (entries of /proc/PID/fd)."""
    threads: int
    """Threads (`Threads` of /proc/PID/status)."""


def read_proc(pid: int, proc_root: Path = Path("/proc")) -> Proc | None:
    """The resources of process `pid`, or None when it is gone (or a zombie with no memory)."""
    try:
        status = (proc_root / str(pid) / "status").read_text()
        fds = len(os.listdir(proc_root / str(pid) / "fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmRSS" not in fields:
        return None
    rss_kb = int(fields["VmRSS"].split()[0])
    return Proc(rss_mb=rss_kb / 1024, fds=fds, threads=int(fields["Threads"]))


@dataclass
class Sample:
    """One look at the run: cumulative counters and the trainer process (None if not running)."""

    t: float
    """Seconds since the soak started the trainer."""
    steps: int = 0
    updates: int = 0
    episodes: int = 0
    invalid: int = 0
    calls: int = 0
    answered: int = 0
    timeouts: int = 0
    unavailable: int = 0
    proc: Proc | None = None
    restarts: int = 0
    """Times the trainer had exited and was resumed before this sample."""


def tally_episode(episode: dict[str, Any]) -> dict[str, int]:
    """The tool counters of one saved episode (`EpisodeResult.to_dict()`)."""
    kinds = [o.get("error_kind") for o in episode.get("tool_outcomes") or []]
    answered = sum(kind in ANSWERED for kind in kinds)
    timeouts, unavailable = kinds.count(TIMEOUT), kinds.count(UNAVAILABLE)
    calls = answered + timeouts + unavailable
    return {
        "episodes": 1,
        "invalid": len(kinds) - calls,
        "calls": calls,
        "answered": answered,
        "timeouts": timeouts,
        "unavailable": unavailable,
    }


@dataclass
class RunCounters:
    """Cumulative counters of a run directory; each rollouts file is read once per version."""

    run_dir: Path
    _files: dict[str, tuple[tuple[int, int], dict[str, int]]] = field(default_factory=dict)

    def read(self) -> dict[str, int]:
        """Steps done, updates, and the tool counters summed over the saved episodes, as of now."""
        rows = read_metrics(self.run_dir / METRICS_FILE)
        totals = dict.fromkeys(COUNTERS, 0)
        steps = {r["step"]: r for r in rows if r["step"] > 0}  # a resumed step: its last row
        totals["steps"] = len(steps)
        totals["updates"] = sum((r.get("train/grad_norm") or 0) > 0 for r in steps.values())
        for path in sorted((self.run_dir / "rollouts").glob("step_*.jsonl")):
            for key, value in self._file_counts(path).items():
                totals[key] += value
        return totals

    def _file_counts(self, path: Path) -> dict[str, int]:
        try:
            st = path.stat()
        except FileNotFoundError:
            return {}
        version = (st.st_size, st.st_mtime_ns)
        cached = self._files.get(path.name)
        if cached is not None and cached[0] == version:
            return cached[1]
        counts = dict.fromkeys(COUNTERS[2:], 0)
        for line in path.read_text(encoding="utf-8").splitlines():
            for key, value in tally_episode(json.loads(line)).items():
                counts[key] += value
        self._files[path.name] = (version, counts)
        return counts


def windows(samples: list[Sample], window_s: float) -> list[dict[str, Any]]:
    """One row per `window_s` of the samples: counter gains, and the process at the window's end.

    A window's gains are its last sample's counters less those of the last sample before it
    (zero for the first); `rss_mb`, `fds`, `threads` are the last live reading in the window,
    `*_max` the highest. A window with no sample is left out; the last may be shorter.
    """
    rows: list[dict[str, Any]] = []
    before = Sample(t=0.0)
    groups: dict[int, list[Sample]] = {}
    for s in samples:
        groups.setdefault(max(0, int((s.t - 1e-9) // window_s)), []).append(s)
    for index in sorted(groups):
        group = groups[index]
        rows.append(_row(index, group, before))
        before = group[-1]
    return rows


def _row(index: int, group: list[Sample], before: Sample) -> dict[str, Any]:
    last = group[-1]
    row: dict[str, Any] = {"window": index + 1, "minutes": round(last.t / 60, 1)}
    row.update({key: getattr(last, key) - getattr(before, key) for key in COUNTERS})
    row["answered_pct"] = round(100 * row["answered"] / row["calls"], 1) if row["calls"] else None
    live = [s.proc for s in group if s.proc is not None]
    for key in ("rss_mb", "fds", "threads"):
        row[key] = round(getattr(live[-1], key), 1) if live else None
        row[f"{key}_max"] = round(max(getattr(p, key) for p in live), 1) if live else None
    row["restarts"] = last.restarts - before.restarts
    return row


def total_row(samples: list[Sample]) -> dict[str, Any]:
    """The whole run as one row (counters from zero, the process at the last live sample)."""
    return {**_row(0, samples, Sample(t=0.0)), "window": "all"}


COLUMNS = (
    ("window", "win"),
    ("minutes", "min"),
    ("steps", "steps"),
    ("updates", "updates"),
    ("episodes", "episodes"),
    ("invalid", "invalid calls"),
    ("calls", "tool calls"),
    ("answered", "answered"),
    ("answered_pct", "answered %"),
    ("timeouts", "timed out"),
    ("unavailable", "unavailable"),
    ("rss_mb", "RSS MiB"),
    ("fds", "fds"),
    ("threads", "threads"),
    ("restarts", "restarts"),
)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a fixed-width text table (`-` where a value is missing)."""
    cells = [[title for _, title in COLUMNS]]
    cells += [["-" if r.get(key) is None else str(r[key]) for key, _ in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    )
