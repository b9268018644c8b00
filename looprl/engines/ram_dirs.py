"""Directories in RAM (`/dev/shm`) that name their owner, and the sweep of those whose owner died.

A vLLM-backed engine exports the model and writes each step's weights to RAM-backed storage,
where a directory costs memory until it is removed. `ram_dir(purpose)` names each one
`looprl-<pid>-<start>-<purpose>-XXXXXXXX`: the creating process's id and its start time (clock
ticks since boot, field 22 of `/proc/<pid>/stat`), so a recycled process id is not taken for
the owner. The owner removes its directories when it closes; when it is killed first, its vLLM
shim removes them (`vllm_shim.py`), and `sweep_ram_dirs()`, run when a trainer or a vLLM engine
starts, removes every directory whose owner no longer runs. A directory whose owner runs, one
of another user, and any name not of this form are never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from looprl.console import console

STAMPED = re.compile(r"^looprl-(\d+)-(\d+)-")


def ram_root() -> Path:
    """Where RAM directories go: `/dev/shm` when it exists, else the temp folder."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(tempfile.gettempdir())


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (ticks since boot); None if it has ended or is a zombie.

    Without `/proc` (macOS) a running process gets 0, the stamp `ram_dir` writes there too.
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return None
        return 0 if _signalable(pid) else None
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):  # exited, not yet reaped by its parent
        return None
    return int(fields[19])


def _signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def ram_dir(purpose: str, root: Path | None = None) -> Path:
    """A fresh directory in `root` (default `ram_root()`), stamped with this process as owner."""
    pid = os.getpid()
    prefix = f"looprl-{pid}-{start_ticks(pid) or 0}-{purpose}-"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root or ram_root()))


def owner(name: str) -> tuple[int, int] | None:
    """The (pid, start) a directory's name is stamped with; None for a name of another form."""
    match = STAMPED.match(name)
    return None if match is None else (int(match[1]), int(match[2]))


@dataclass
class Sweep:
    """What `sweep_ram_dirs` removed: the directories, their bytes, and their owners' ids."""

    root: Path
    removed: int = 0
    freed_bytes: int = 0
    pids: tuple[int, ...] = ()

    def line(self) -> str | None:
        """One line for the console (None when nothing was removed)."""
        if not self.removed:
            return None
        pids = ", ".join(str(p) for p in self.pids)
        many = "directory" if self.removed == 1 else "directories"
        return (
            f"freed {_size(self.freed_bytes)} in {self.root}: removed {self.removed} {many} "
            f"left by looprl processes that no longer run (pid {pids})"
        )


def sweep_ram_dirs(root: Path | None = None) -> Sweep:
    """Remove this user's stamped directories in `root` (default `ram_root()`) whose owner died."""
    root = root or ram_root()
    sweep = Sweep(root)
    try:
        entries = list(os.scandir(root))
    except OSError:
        return sweep
    pids = set()
    for entry in entries:
        stamp = owner(entry.name)
        if stamp is None or start_ticks(stamp[0]) == stamp[1] or not _mine_dir(entry):
            continue  # not ours to judge, or its owner runs
        size = _tree_bytes(Path(entry.path))
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            sweep.removed += 1
            sweep.freed_bytes += size
            pids.add(stamp[0])
    sweep.pids = tuple(sorted(pids))
    return sweep


def sweep_and_report(root: Path | None = None) -> Sweep:
    """`sweep_ram_dirs`, printing its one line when it removed anything."""
    sweep = sweep_ram_dirs(root)
    line = sweep.line()
    if line:
        console.print(f"[yellow]note:[/yellow] {line}", highlight=False)
    return sweep


def _mine_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False) and entry.stat().st_uid == os.getuid()
    except OSError:
        return False


def _tree_bytes(path: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"
