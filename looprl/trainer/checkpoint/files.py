"""Checkpoint directory layout: file names, finding a run's checkpoints, synced writes, renames.

A run's checkpoints live in `run_dir/checkpoints/step_XXXXXX/`; writers build them in scratch
directories (`step_XXXXXX.tmp-<pid>`, `.NAME.tmp-<pid>`, `.NAME.old-<pid>`) that
`clean_stale_tmp` removes once their process is gone. What a checkpoint holds and how it is
written is described in `looprl.trainer.checkpoint.single`; how it is verified, in
`looprl.trainer.checkpoint.verify`.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
MODEL_FILE = "model.safetensors"
ADAPTER_FILE = "adapter.safetensors"
VALUE_HEAD_FILE = "value_head.safetensors"
TORCH_FILES = ("optimizer.pt", "scheduler.pt", "rng.pt")
STATE_FILE = "state.json"
STEP_DIR = re.compile(r"^step_(\d+)$")
_SCRATCH_DIR = re.compile(r"^(?:step_\d+\.tmp|\..+\.(?:tmp|old))-(\d+)$")


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of `step` lives: `run_dir/checkpoints/step_{step:06d}`."""
    return Path(run_dir) / CHECKPOINTS / f"step_{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Checkpoints of a run that have a manifest, as (step, path), oldest first; temp dirs are ignored.

    Their files are not verified here: `verify_checkpoint` does that, `resume_latest` uses it.
    """
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / COMPLETE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint with a manifest and the highest step, or None; not verified (see `resume_latest`)."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def step_dirs(run_dir: str | Path) -> list[Path]:
    """Every `step_XXXXXX` directory of a run, manifest or not, newest first."""
    root = Path(run_dir) / CHECKPOINTS
    found = []
    for p in root.iterdir() if root.is_dir() else []:
        m = STEP_DIR.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found, reverse=True)]


def prune_checkpoints(run_dir: str | Path, keep_last: int, keep: Path) -> None:
    """Delete all but the `keep_last` newest checkpoints of a run, never `keep` (the one just saved)."""
    for _, p in list_checkpoints(run_dir)[:-keep_last]:
        if p != keep:
            shutil.rmtree(p, ignore_errors=True)


def clean_stale_tmp(directory: Path) -> list[Path]:
    """Remove `step_*.tmp-<pid>`, `.*.tmp-<pid>`, `.*.old-<pid>` leftovers of killed writers; return what was removed.

    A leftover is stale when its process is gone, or is this process (which writes one at a
    time and cleans up after itself, so an own leftover is from an earlier, failed attempt).
    """
    removed = []
    for p in directory.iterdir() if directory.is_dir() else []:
        m = _SCRATCH_DIR.match(p.name)
        if m and p.is_dir() and not _other_process_alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def fsync_dir(path: Path) -> None:
    """Flush a directory entry to disk (so a rename or new file survives a power loss)."""
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _other_process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def swap_into_place(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`; an existing `final` is moved aside first and deleted after."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to `<name>.damaged` (or `.damaged-2`, ...) and return the new path."""
    n = 1
    aside = path.with_name(f"{path.name}.damaged")
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{n}")
    os.rename(path, aside)
    fsync_dir(path.parent)
    return aside


def torch_save_synced(obj: Any, path: Path) -> None:
    """`torch.save` `obj` to `path` and fsync it (a checkpoint's `.pt` files)."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def write_text_synced(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` and fsync it (`state.json`, the manifest)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
