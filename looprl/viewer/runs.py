"""Find training runs and eval result directories on disk, and answer the viewer's queries on them.

A training run directory holds `metrics.jsonl`, `config.json`, `rollouts/step_NNNNNN.jsonl` and
`eval/step_NNNNNN/results.jsonl`; an eval result directory (from `looprl eval`) holds
`metadata.json` and `results.jsonl`; a probe directory (`looprl probe`) holds `probe.json` and
`results.jsonl`. Everything here only reads: the run directory is never
written to. Indexes live in memory and grow as the files grow.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from looprl.viewer.insights import (
    eval_anchor,
    eval_grid,
    group_advantage,
    monitor_trips,
    run_status,
)
from looprl.viewer.jsonl import (
    FLAG_ERROR,
    FLAG_MALFORMED,
    FLAG_TOOL_ERROR,
    FLAG_TRUNCATED,
    EpisodeFile,
    Interner,
    MalformedRow,
    MetricsFile,
)
from looprl.viewer.probe import PROBE_FILE, ExploitIndex, probe_problem
from looprl.viewer.schema import read_json

_STEP = re.compile(r"(\d+)")
ERROR_FILTERS = ("all", "errors", "tool_errors", "truncated", "clean")


TRAIN_MARKERS = ("config.json", "metrics.jsonl", "rollouts")
EVAL_MARKERS = ("results.jsonl", "metadata.json")


def run_kind(path: Path) -> str | None:
    """`train` (a training run), `eval` (`looprl eval` results), `probe` (`looprl probe`), or None."""
    if (path / PROBE_FILE).exists():
        return "probe"
    if any((path / m).exists() for m in TRAIN_MARKERS):
        return "train"
    if any((path / m).exists() for m in EVAL_MARKERS):
        return "eval"
    return None


def _step_of(name: str) -> int | None:
    m = _STEP.findall(name)
    return int(m[-1]) if m else None


def file_key(source: str, step: int | None) -> str:
    """The API's name for one episode file: `train:12`, `eval:10`, or `eval:-` (no step)."""
    return f"{source}:{'-' if step is None else step}"


@dataclass
class Query:
    """A rollouts query: which files, which filters, which page."""

    source: str = "train"
    step: int | None = None  # None: every step
    env: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    errors: str = "all"
    task: str | None = None
    exploit: str | None = None  # probe directories: only this exploit's episodes
    offset: int = 0
    limit: int = 50


class Run:
    """One training run or eval result directory, indexed lazily."""

    def __init__(self, run_id: str, path: Path) -> None:
        self.id = run_id
        self.path = path
        self.metrics = MetricsFile(path / "metrics.jsonl")
        self.tasks = Interner()
        self.envs = Interner()
        self.files: dict[str, tuple[str, int | None, EpisodeFile]] = {}
        self.exploits = ExploitIndex()
        self._lock = threading.Lock()

    @property
    def kind(self) -> str:
        """`train`, `eval` or `probe` (looked up each time: a run directory fills in as it starts)."""
        return run_kind(self.path) or "train"

    @property
    def name(self) -> str:
        """The directory name shown in the page."""
        return self.path.name

    def scan(self) -> None:
        """Pick up episode files that appeared since the last scan."""
        found: list[tuple[str, int | None, Path]] = []
        if self.kind in ("eval", "probe"):
            found.append(("eval", None, self.path / "results.jsonl"))
        else:
            roll = self.path / "rollouts"
            if roll.is_dir():
                found += [("train", _step_of(p.stem), p) for p in roll.glob("*.jsonl")]
            ev = self.path / "eval"
            if ev.is_dir():
                found += [("eval", _step_of(p.parent.name), p) for p in ev.glob("*/results.jsonl")]
        with self._lock:
            for source, step, p in found:
                key = file_key(source, step)
                if key not in self.files:
                    self.files[key] = (source, step, EpisodeFile(p, self.tasks, self.envs))

    def episode_files(
        self, source: str, step: int | None
    ) -> list[tuple[str, int | None, EpisodeFile]]:
        """(key, step, file) of one source (`train` or `eval`) in step order; one step or all."""
        self.scan()
        with self._lock:
            picked = [(k, s, f) for k, (src, s, f) in self.files.items() if src == source]
        if step is not None:
            picked = [e for e in picked if e[1] == step]
        return sorted(picked, key=lambda e: -1 if e[1] is None else e[1])

    def info(self) -> dict[str, Any]:
        """Summary for `/api/runs`: kind, files per source, metric count and notices."""
        self.scan()
        self.metrics.refresh(budget_s=0.2)
        with self._lock:
            files = sorted(self.files.items(), key=lambda kv: (kv[1][0], kv[1][1] or -1))
        out_files = []
        skipped = self.metrics.skipped
        for key, (source, step, f) in files:
            skipped += f.skipped
            out_files.append(
                {
                    "key": key,
                    "source": source,
                    "step": step,
                    "episodes_indexed": f.usable(),
                    "bytes": f.size(),
                    "skipped": f.skipped,
                    "partial": f.partial,
                }
            )
        meta = read_json(self.path / "metadata.json") if self.kind == "eval" else None
        with self.metrics.lock:
            monitors = monitor_trips(self.metrics.rows)
        return {
            "id": self.id,
            "name": self.name,
            "path": str(self.path),
            "kind": self.kind,
            "files": out_files,
            "metric_rows": len(self.metrics.rows),
            "metrics_notice": self.metrics.notice(),
            "skipped_total": skipped,
            "summary": meta.get("summary") if isinstance(meta, dict) else None,
            "monitors": monitors,
            "anchors": [],  # filled in by `Catalog.anchors`
            **(run_status(self.path) if self.kind == "train" else saved_status(meta)),
        }

    def config(self) -> dict[str, Any]:
        """The run's saved config (`config.json`) and eval metadata (`metadata.json`)."""
        return {
            "config": read_json(self.path / "config.json"),
            "metadata": read_json(self.path / "metadata.json"),
        }

    def query(self, q: Query, budget_s: float = 0.25) -> dict[str, Any]:
        """One page of episode summaries matching `q`, plus the total and indexing progress."""
        if q.errors not in ERROR_FILTERS:
            raise ValueError(f"unknown errors filter {q.errors!r}; choose one of {ERROR_FILTERS}")
        deadline = time.perf_counter() + budget_s
        complete = True
        matches: list[tuple[str, int | None, EpisodeFile, np.ndarray]] = []
        total = 0
        files = self.episode_files(q.source, q.step)
        for key, step, f in files:
            left = deadline - time.perf_counter()
            if left <= 0 or not f.refresh(budget_s=left):
                complete = False
            idx = self._filter(f, q)
            if len(idx):
                matches.append((key, step, f, idx))
                total += len(idx)
        items, found_malformed = self._page(matches, q.offset, q.limit)
        return {
            "items": items,
            "total": total - found_malformed,
            "skipped": sum(f.skipped for _, _, f in files),
            "complete": complete,
            "envs": sorted(n for n in self.envs.names),
            "offset": q.offset,
            "limit": q.limit,
        }

    def _filter(self, f: EpisodeFile, q: Query) -> np.ndarray:
        cols = f.columns()
        flags = cols["flags"]
        keep = (flags & FLAG_MALFORMED) == 0
        if q.env is not None:
            code = self.envs.ids.get(q.env)
            keep &= cols["env"] == (-1 if code is None else code)
        if q.task is not None:
            code = self.tasks.ids.get(q.task)
            keep &= cols["task"] == (-1 if code is None else code)
        if q.min_reward is not None:
            keep &= cols["reward"] >= q.min_reward
        if q.max_reward is not None:
            keep &= cols["reward"] <= q.max_reward
        if q.errors == "errors":
            keep &= (flags & FLAG_ERROR) != 0
        elif q.errors == "tool_errors":
            keep &= (flags & FLAG_TOOL_ERROR) != 0
        elif q.errors == "truncated":
            keep &= (flags & FLAG_TRUNCATED) != 0
        elif q.errors == "clean":
            keep &= (flags & (FLAG_ERROR | FLAG_TOOL_ERROR)) == 0
        if q.exploit is not None:
            self.exploits.update(f)
            chosen = np.zeros(len(keep), dtype=bool)
            chosen[[i for i in self.exploits.by_name.get(q.exploit, []) if i < len(keep)]] = True
            keep &= chosen
        return np.nonzero(keep)[0]

    def _page(
        self,
        matches: list[tuple[str, int | None, EpisodeFile, np.ndarray]],
        offset: int,
        limit: int,
    ) -> tuple[list[dict[str, Any]], int]:
        """(summaries of matches from `offset` on, at most `limit`; lines found malformed).

        A line whose whole parse fails is skipped (and marked, so later queries leave it out)
        and the page takes the next match instead.
        """
        items: list[dict[str, Any]] = []
        found_malformed = 0
        skip = max(0, offset)
        for key, step, f, idx in matches:
            if skip >= len(idx):
                skip -= len(idx)
                continue
            for i in idx[skip:]:
                try:
                    ep = f.read(int(i))
                except MalformedRow:
                    found_malformed += 1
                    continue
                items.append({"file": key, "step": step, "i": int(i), **episode_brief(ep)})
                if len(items) >= limit:
                    return items, found_malformed
            skip = 0
        return items, found_malformed

    def group(self, key: str, i: int) -> dict[str, Any] | None:
        """Training episode `i` of file `key`: its group's rewards and recomputed advantage."""
        with self._lock:
            entry = self.files.get(key)
        if entry is None or entry[0] != "train":
            return None
        return group_advantage(entry[2], i, read_json(self.path / "config.json"))

    def grid(self) -> dict[str, Any]:
        """Held-out tasks x eval steps of this run (see `looprl.viewer.insights.eval_grid`)."""
        files = self.episode_files("eval", None)
        for _, _, f in files:
            f.refresh(budget_s=0.5)
        return eval_grid(files, list(self.tasks.names))

    def probe(self) -> dict[str, Any]:
        """The probe table (`probe.json`, checked) and the episode indexes of each exploit."""
        doc = read_json(self.path / PROBE_FILE)
        problem = "probe.json is missing or not valid JSON" if doc is None else probe_problem(doc)
        files = self.episode_files("eval", None)
        if files:
            self.exploits.update(files[0][2])
        return {
            "probe": None if problem else doc,
            "problem": problem,
            "file": files[0][0] if files else None,
            "episodes": self.exploits.by_name,
            "unnamed": len(self.exploits.unnamed),
        }

    def episode(self, key: str, i: int) -> tuple[int | None, dict[str, Any]]:
        """(step, full episode dict) of episode `i` of file `key`."""
        self.scan()
        with self._lock:
            entry = self.files.get(key)
        if entry is None:
            raise KeyError(f"run {self.id!r} has no episode file {key!r}; see /api/runs")
        _, step, f = entry
        f.refresh(budget_s=0.2)
        return step, f.read(i)


def saved_status(meta: Any) -> dict[str, str]:
    """{"status", "why"} of an eval or probe directory: its `metadata.json` status, else finished."""
    status = meta.get("status") if isinstance(meta, dict) else None
    if isinstance(status, str):
        return {"status": status, "why": "metadata.json"}
    return {"status": "finished", "why": "results written"}


def episode_brief(ep: dict[str, Any]) -> dict[str, Any]:
    """The columns of the rollouts table for one episode (checked by `looprl.viewer.schema`)."""
    task = ep.get("task") or {}
    msgs = ep.get("messages") or []
    last = next((m for m in reversed(msgs) if m.get("role") == "assistant"), None)
    preview = (last.get("content") or last.get("raw") or "") if last else ""
    prompt = task.get("prompt")
    if isinstance(prompt, list):
        users = [m.get("content") or "" for m in prompt if m.get("role") == "user"]
        prompt = users[-1] if users else ""
    trajs = ep.get("trajectories") or []
    return {
        "task_id": str(task.get("id", "")),
        "env": task.get("env") or "",
        "reward": ep.get("reward"),
        "rewards": ep.get("rewards") or {},
        "num_turns": ep.get("num_turns", 0),
        "num_tool_calls": ep.get("num_tool_calls", 0),
        "errors": [str(e.get("kind", "error")) for e in ep.get("errors") or []],
        "tool_errors": ep.get("tool_errors") or {},
        "truncated": bool(ep.get("truncated")),
        "stop_reason": ep.get("stop_reason", ""),
        "rollout_index": ep.get("rollout_index", 0),
        "tokens": sum(len(t.get("token_ids") or []) for t in trajs),
        "sampled": sum(sum(t.get("mask") or []) for t in trajs),
        "preview": preview[:160],
        "prompt": str(prompt or "")[:160],
    }


class Catalog:
    """The runs behind the paths given on the command line; folders of runs are re-scanned."""

    def __init__(self, paths: list[Path]) -> None:
        self.roots: list[Path] = []
        for p in paths:
            p = Path(p).expanduser().resolve()
            if not p.is_dir():
                raise FileNotFoundError(
                    f"{p} is not a directory; give a run directory (runs/NAME), a folder of "
                    "runs, or an eval result directory"
                )
            self.roots.append(p)
        self.runs: dict[Path, Run] = {}
        self._lock = threading.Lock()
        self.discover()

    def discover(self) -> list[Run]:
        """All runs, in command-line order then name order (new runs in folders are added)."""
        ordered: list[Path] = []
        for root in self.roots:
            if run_kind(root) is not None:
                ordered.append(root)
                continue
            kids = sorted(c for c in root.iterdir() if c.is_dir())
            ordered += [c for c in kids if run_kind(c) is not None]
        with self._lock:
            for p in ordered:
                if p not in self.runs:
                    self.runs[p] = Run(self._unique_id(p.name), p)
            return [self.runs[p] for p in dict.fromkeys(ordered)]

    def anchors(self, infos: list[dict[str, Any]]) -> None:
        """Attach to each training run's info the eval directories of its start or end model."""
        runs = {r.id: r for r in self.runs.values()}
        evals = [(runs[i["id"]].path, read_json(runs[i["id"]].path / "metadata.json"), i)
                 for i in infos if i["kind"] == "eval"]  # fmt: skip
        for info in infos:
            if info["kind"] != "train":
                continue
            path = runs[info["id"]].path
            config = read_json(path / "config.json")
            for epath, meta, einfo in evals:
                found = eval_anchor(path, config, epath, meta)
                if found:
                    info["anchors"].append({"run": einfo["id"], "name": einfo["name"], **found})

    def _unique_id(self, name: str) -> str:
        taken = {r.id for r in self.runs.values()}
        rid, n = name, 2
        while rid in taken:
            rid, n = f"{name}-{n}", n + 1
        return rid

    def get(self, run_id: str) -> Run:
        """The run with id `run_id`; KeyError with the known ids otherwise."""
        for r in self.discover():
            if r.id == run_id:
                return r
        known = sorted(r.id for r in self.runs.values())
        raise KeyError(f"unknown run {run_id!r}; known runs: {known}")
