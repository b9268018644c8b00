"""Checkpoint verification: the manifest format, file hashes, damage errors, parsing before use.

The manifest (`COMPLETE`, written last by `save_checkpoint`) holds the step, the weights kind
and, since format 2, each file's size and sha256. `read_checkpoint` checks the manifest's shape
and every file's size and hash before it uses any of them (a format-1 checkpoint, written before
hashes existed, is checked by parsing its files, with a warning), then parses every file a load
will use, so a damaged checkpoint raises `CheckpointDamaged` (naming the file and the fault)
before anything live is changed. A sharded checkpoint (written under torchrun) says
`weights: "sharded"` and `world: N`; `read_sharded` verifies it, and loading it with another
number of processes raises `WorldSizeMismatch`, one line naming the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from looprl.trainer.checkpoint.files import (
    ADAPTER_FILE,
    COMPLETE,
    MODEL_FILE,
    STATE_FILE,
    STEP_DIR,
    TORCH_FILES,
    VALUE_HEAD_FILE,
)

DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of a sharded checkpoint
MANIFEST_FORMAT = 2  # 1 (no "format" key): the manifest held no file list and no hashes
# sha256 over blake2b: 1.9 GB/s against 1.3 GB/s here (x86 with SHA-NI). Hashing is one read
# of each file just written (from the page cache): the `tiny` model's 30 MB checkpoint with
# AdamW state saves in ~53 ms instead of ~39 ms, and verifying it on load takes ~16 ms.
HASH = "sha256"
HASHES: dict[str, Callable[[], Any]] = {"sha256": hashlib.sha256, "blake2b": hashlib.blake2b}

Warn = Callable[[str], None]


def default_warn(message: str) -> None:
    """The default `warn`: a Python `UserWarning` (the trainer passes its console instead)."""
    warnings.warn(message, UserWarning, stacklevel=3)


class CheckpointDamaged(Exception):
    """A checkpoint that failed verification; `path` is its directory, `reason` names the file and fault."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"checkpoint {path} is damaged: {reason}; it was not loaded (nothing was changed). "
            "Load an older checkpoint, or use resume_latest(run_dir, ...) to find the newest intact one"
        )
        self.path = path
        self.reason = reason


class WorldSizeMismatch(ValueError):
    """A checkpoint written by another number of processes than the run resuming it."""

    def __init__(self, path: Path, saved: int, world: int) -> None:
        again = f"looprl train --nproc {saved} --resume" if saved > 1 else "looprl train --resume"
        kind = f"{saved} processes (sharded)" if saved > 1 else "one process"
        super().__init__(
            f"cannot resume: checkpoint {path.name} was written by {kind} and this run has "
            f"{world}; resume with the same number ({again}), or start a new run without --resume"
        )
        self.path, self.saved, self.world = path, saved, world


class NoIntactCheckpoint(RuntimeError):
    """No checkpoint of a run passed verification; `tried` holds (directory, reason), newest first."""

    def __init__(self, root: Path, tried: list[tuple[Path, str]]) -> None:
        lines = "".join(f"\n  {path.name}: {reason}" for path, reason in tried)
        super().__init__(
            f"cannot resume: none of the {len(tried)} checkpoint(s) in {root} is intact:{lines}\n"
            "Nothing was deleted or moved; the damaged checkpoints stay there for inspection. "
            "To go on, restore an intact checkpoint into that directory, resume another run "
            "(--run-dir DIR --resume), or start a fresh run without --resume under another name "
            "(--run.name NAME or --run-dir DIR)."
        )
        self.root = root
        self.tried = tried


def verify_checkpoint(path: str | Path, *, warn: Warn = default_warn) -> None:
    """Check a checkpoint without loading it into anything; raise `CheckpointDamaged` if it is damaged.

    The same checks as `load_checkpoint`: the manifest's shape, each file's size and hash, and
    that every file parses (the torch files are read in full, so this costs a load's memory).
    """
    read_checkpoint(Path(path), TORCH_FILES, warn)


@dataclass(frozen=True)
class Found:
    """A verified checkpoint, parsed: which weights file, whether a value head, state, torch files."""

    weights: str
    has_head: bool
    state: dict[str, Any]
    torch: dict[str, Any]


def read_checkpoint(path: Path, need: tuple[str, ...] | list[str], warn: Warn) -> Found:
    """Check the manifest and every file's size and hash, then parse what a load will use."""
    manifest = _read_manifest(path)
    if manifest["weights"] == "sharded":
        raise WorldSizeMismatch(path, manifest["world"], 1)
    files: dict[str, Any] | None = manifest.get("files")
    if files is None:
        warn(
            f"checkpoint {path.name} has no file hashes (written by an older looprl), so its files "
            "are checked only by parsing them; checkpoints saved from now on carry hashes"
        )
        has_head = (path / VALUE_HEAD_FILE).is_file()
    else:
        for name, entry in files.items():
            problem = _file_problem(path / name, entry)
            if problem:
                raise CheckpointDamaged(path, problem)
        has_head = VALUE_HEAD_FILE in files
    weights = ADAPTER_FILE if manifest["weights"] == "adapter" else MODEL_FILE
    for name in (weights, VALUE_HEAD_FILE) if has_head else (weights,):
        _check_safetensors(path, name)
    state = _read_state(path)
    return Found(weights, has_head, state, {name: _read_torch(path, name) for name in need})


def read_sharded(path: Path, world: int) -> dict[str, Any]:
    """Verify a sharded checkpoint written by `world` processes; return its `state.json`.

    Raises `WorldSizeMismatch` when it was written by another number of processes (or by one)
    and `CheckpointDamaged` when its manifest, a file's size or a file's hash is wrong.
    """
    manifest = _read_manifest(path)
    saved = manifest["world"] if manifest["weights"] == "sharded" else 1
    if saved != world:
        raise WorldSizeMismatch(path, saved, world)
    if "files" not in manifest:
        raise CheckpointDamaged(path, f"manifest {COMPLETE} has no file list")
    for name, entry in manifest["files"].items():
        problem = _file_problem(path / name, entry)
        if problem:
            raise CheckpointDamaged(path, problem)
    return _read_state(path)


def checkpoint_world(path: Path) -> int | None:
    """How many processes wrote the checkpoint at `path` (None: its manifest is unreadable)."""
    try:
        manifest = _read_manifest(path)
    except CheckpointDamaged:
        return None
    return int(manifest["world"]) if manifest["weights"] == "sharded" else 1


def rng_file(rank: int) -> str:
    """The file of a sharded checkpoint that holds rank `rank`'s RNG states."""
    return f"rng_rank{rank}.pt"


def _read_manifest(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise CheckpointDamaged(path, "it is not a directory")
    try:
        text = (path / COMPLETE).read_text(encoding="utf-8")
    except FileNotFoundError:
        held = ", ".join(sorted(p.name for p in path.iterdir())) or "nothing"
        raise CheckpointDamaged(
            path, f"manifest {COMPLETE} is missing (the directory holds {held})"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointDamaged(path, f"manifest {COMPLETE} cannot be read ({brief(e)})") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointDamaged(path, f"manifest {COMPLETE} is not valid JSON ({e})") from None
    m = STEP_DIR.match(path.name)
    problem = _manifest_problem(manifest, int(m.group(1)) if m else None)
    if problem:
        raise CheckpointDamaged(path, f"manifest {COMPLETE} {problem}")
    return dict(manifest)


def _manifest_problem(manifest: Any, dir_step: int | None) -> str | None:
    """What is wrong with a parsed manifest's shape, or None (a format-1 manifest has no files)."""
    if not isinstance(manifest, dict):
        return f"holds a JSON {type(manifest).__name__}, expected an object"
    step = manifest.get("step")
    if type(step) is not int:
        return f"has step={step!r}, expected an integer"
    if dir_step is not None and step != dir_step:
        return f"says step {step} but the directory is step {dir_step}"
    weights = manifest.get("weights")
    if weights not in ("full", "adapter", "sharded"):
        return f"has weights={weights!r}, expected 'full', 'adapter' or 'sharded'"
    world = manifest.get("world")
    if weights == "sharded" and (type(world) is not int or world < 2):
        return f"has world={world!r}, expected the number of processes (>= 2) of a sharded one"
    if "files" not in manifest and "format" not in manifest:
        return None  # format 1, from before hashes
    files = manifest.get("files")
    if not isinstance(files, dict):
        return f"has files={files!r}, expected an object of file name -> {{size, {HASH}}}"
    for name, entry in files.items():
        if name in ("", ".", "..", COMPLETE) or "/" in name or "\\" in name:
            return f"lists {name!r}, which is not a file of the checkpoint"
        problem = _entry_problem(entry)
        if problem:
            return f"entry for {name}: {problem}"
    return _missing(files, weights, world)


def _missing(files: dict[str, Any], weights: str, world: Any) -> str | None:
    """Which files a manifest of this kind must list and does not, or None."""
    if weights == "sharded":
        need = [DCP_METADATA, "scheduler.pt", STATE_FILE, *(rng_file(r) for r in range(world))]
    else:
        need = [ADAPTER_FILE if weights == "adapter" else MODEL_FILE, *TORCH_FILES, STATE_FILE]
    missing = [n for n in need if n not in files]
    return f"does not list {', '.join(missing)}" if missing else None


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return f"{entry!r} is not an object with size and {HASH}"
    size = entry.get("size")
    if type(size) is not int or size < 0:
        return f"size={size!r} is not a byte count"
    algos = [k for k in entry if k in HASHES]
    if len(algos) != 1:
        return f"needs exactly one hash of {sorted(HASHES)}, has {sorted(k for k in entry if k != 'size')}"
    digest, length = entry[algos[0]], HASHES[algos[0]]().digest_size * 2
    if not isinstance(digest, str) or not re.fullmatch(f"[0-9a-f]{{{length}}}", digest):
        return f"{algos[0]}={digest!r} is not a {length}-digit hex digest"
    return None


def _file_problem(file: Path, entry: dict[str, Any]) -> str | None:
    """Why `file` is not the one the manifest entry describes, or None when size and hash agree."""
    try:
        if not file.is_file():
            return f"{file.name} is missing" if not file.exists() else f"{file.name} is not a file"
        size = file.stat().st_size
        if size != entry["size"]:
            return f"{file.name} has {size} bytes, manifest says {entry['size']}"
        algo = next(k for k in entry if k in HASHES)
        with open(file, "rb") as f:
            digest = hashlib.file_digest(f, HASHES[algo]).hexdigest()
    except OSError as e:
        return f"{file.name} cannot be read ({brief(e)})"
    if digest != entry[algo]:
        return (
            f"{file.name} has {algo} {digest[:12]}..., manifest says {entry[algo][:12]}... "
            "(its bytes changed after it was written)"
        )
    return None


def _check_safetensors(path: Path, name: str) -> None:
    """Parse the header of a safetensors file (it also checks the data fits the file's size)."""
    if not (path / name).is_file():
        raise CheckpointDamaged(path, f"{name} is missing")
    try:
        with safe_open(str(path / name), framework="pt") as f:
            f.keys()
    except Exception as e:  # safetensors raises its own SafetensorError as well as OSError
        raise CheckpointDamaged(path, f"{name} cannot be loaded ({brief(e)})") from None


def _read_torch(path: Path, name: str) -> Any:
    if not (path / name).is_file():
        raise CheckpointDamaged(path, f"{name} is missing")
    try:
        return _torch_load(path / name)
    except Exception as e:  # torch.load raises RuntimeError, EOFError, UnpicklingError, ...
        raise CheckpointDamaged(path, f"{name} cannot be loaded ({brief(e)})") from None


def _read_state(path: Path) -> dict[str, Any]:
    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointDamaged(path, f"{STATE_FILE} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointDamaged(path, f"{STATE_FILE} cannot be read ({brief(e)})") from None
    if not isinstance(state, dict):
        raise CheckpointDamaged(
            path, f"{STATE_FILE} holds a JSON {type(state).__name__}, expected an object"
        )
    return state


def brief(e: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    first = (str(e).strip().splitlines() or [""])[0]
    text = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def seal_file(path: Path) -> dict[str, Any]:
    """fsync a written file and return its manifest entry (size and hash, from one read)."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, HASHES[HASH]).hexdigest()
        size = f.tell()
        os.fsync(f.fileno())
    return {"size": size, HASH: digest}


def _torch_load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)
