"""Atomic, verified training checkpoints (weights, optimizer, scheduler, RNG, trainer state) and HF export.

Layout of one checkpoint, `run_dir/checkpoints/step_000120/`:

- `model.safetensors` (full weights, tied tensors stored once) or `adapter.safetensors`
  (PEFT adapter weights only, when saved with `adapter_only=True`)
- `value_head.safetensors` (optional, PPO)
- `optimizer.pt`, `scheduler.pt` (`torch.save` of their state dicts)
- `rng.pt` (python `random`, numpy, torch CPU, CUDA and any named `torch.Generator` states)
- `state.json` (the trainer's JSON state: step, task cursor, ...)
- `COMPLETE`, the manifest, written last: step, weights kind, and each file's size and sha256.
  A directory without it is never loaded.

Everything is written into `step_000120.tmp-<pid>/`, fsynced, then renamed into place, so a
run killed at any moment (`kill -9` included) leaves either the old set of checkpoints or the
new one, never a half-written checkpoint that `latest_checkpoint` would pick.

Loading checks the manifest's shape and every file's size and hash before it uses any of them
(a checkpoint written before hashes existed is checked by parsing its files, with a warning),
and parses every file it will use before it changes the model, so a damaged checkpoint raises
`CheckpointDamaged` (naming the file and the fault) and leaves the live objects untouched.
`resume_latest` goes from the newest checkpoint to older ones until one is intact, and moves
the damaged newer ones aside (`step_000120.damaged`), never deleting them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import re
import shutil
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
MODEL_FILE = "model.safetensors"
ADAPTER_FILE = "adapter.safetensors"
VALUE_HEAD_FILE = "value_head.safetensors"
TORCH_FILES = ("optimizer.pt", "scheduler.pt", "rng.pt")
STATE_FILE = "state.json"
MANIFEST_FORMAT = 2  # 1 (no "format" key): the manifest held no file list and no hashes
# sha256 over blake2b: 1.9 GB/s against 1.3 GB/s here (x86 with SHA-NI). Hashing is one read
# of each file just written (from the page cache): the `tiny` model's 30 MB checkpoint with
# AdamW state saves in ~53 ms instead of ~39 ms, and verifying it on load takes ~16 ms.
HASH = "sha256"
HASHES: dict[str, Callable[[], Any]] = {"sha256": hashlib.sha256, "blake2b": hashlib.blake2b}
_STEP_DIR = re.compile(r"^step_(\d+)$")
_SCRATCH_DIR = re.compile(r"^(?:step_\d+\.tmp|\..+\.(?:tmp|old))-(\d+)$")

Warn = Callable[[str], None]


def _warn(message: str) -> None:
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


@dataclass(frozen=True)
class Resumed:
    """What `resume_latest` loaded.

    path: the checkpoint directory that was loaded (the newest intact one).
    state: its `state.json` (step, task cursor, ...).
    damaged: newer checkpoints that failed verification, as (where they were moved, reason).
    """

    path: Path
    state: dict[str, Any]
    damaged: list[tuple[Path, str]]


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
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / COMPLETE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint with a manifest and the highest step, or None; not verified (see `resume_latest`)."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extra_state: Mapping[str, Any],
    value_head: torch.nn.Module | None = None,
    keep_last: int | None = 3,
    adapter_only: bool = False,
    generators: Mapping[str, torch.Generator] | None = None,
) -> Path:
    """Write the checkpoint of `step` atomically, prune old ones, and return its directory.

    `extra_state` must be JSON-serializable (step, task cursor, best metric, ...); it is saved as
    `state.json` with `step` added. `adapter_only=True` saves only the PEFT adapter weights
    (the model must be a `peft.PeftModel`). `generators` are extra named `torch.Generator`s
    (e.g. an engine's sampler) whose states are saved with the global RNGs. `keep_last` keeps
    that many most recent checkpoints (None keeps all); the one just written is never removed.
    An existing checkpoint of the same step is replaced, unless it fails verification: then it
    is moved aside to `step_XXXXXX.damaged` (with a warning) and kept for inspection.
    """
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None (keep all), got {keep_last}")
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    state = dict(extra_state)
    if state.setdefault("step", step) != step:
        raise ValueError(f"extra_state['step']={state['step']} disagrees with step={step}")
    try:
        state_text = json.dumps(state, indent=2, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"extra_state must be JSON-serializable (plain numbers, str, lists, dicts): {e}"
        ) from e

    final = checkpoint_dir(run_dir, step)
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_tmp(final.parent)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    try:
        tmp.mkdir()
        _save_weights(tmp, model, value_head, adapter_only)
        _torch_save(optimizer.state_dict(), tmp / "optimizer.pt")
        _torch_save(scheduler.state_dict() if scheduler is not None else None, tmp / "scheduler.pt")
        _torch_save(_rng_state(generators), tmp / "rng.pt")
        _write_text(tmp / STATE_FILE, state_text)
        files = {f.name: _seal(f) for f in sorted(tmp.iterdir())}  # fsync + size + hash
        meta = {
            "format": MANIFEST_FORMAT,
            "step": step,
            "weights": "adapter" if adapter_only else "full",
            "time": time.time(),
            "files": files,
        }
        _write_text(tmp / COMPLETE, json.dumps(meta, indent=1))
        fsync_dir(tmp)
        _keep_if_damaged(final)
        _swap_into_place(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if keep_last is not None:
        _prune(run_dir, keep_last, keep=final)
    return final


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    value_head: torch.nn.Module | None = None,
    generators: Mapping[str, torch.Generator] | None = None,
    restore_rng: bool = True,
    warn: Warn = _warn,
) -> dict[str, Any]:
    """Verify a checkpoint written by `save_checkpoint`, restore it in place, return its `state.json`.

    Before anything is restored, every file's size and hash are checked against the manifest
    and every file that will be used is parsed; a damaged checkpoint raises `CheckpointDamaged`
    (naming the file and the fault) and leaves the model, optimizer, scheduler and RNGs as they
    were. A checkpoint written without hashes (by an older looprl) is checked by parsing only,
    and `warn` says so. Weights are copied into the existing parameters (optimizers built on
    them stay valid). An adapter checkpoint needs `model` to be a PEFT model with the same
    adapter config. Pass the optimizer and scheduler built exactly as in the original run;
    `generators` must name the same generators that were saved. RNG states are restored unless
    `restore_rng=False`.
    """
    path = Path(path)
    wanted = (optimizer is not None, scheduler is not None, restore_rng)
    need = [name for name, want in zip(TORCH_FILES, wanted, strict=True) if want]
    found = _read_checkpoint(path, need, warn)
    if value_head is not None and not found.has_head:
        raise FileNotFoundError(
            f"{path} has no {VALUE_HEAD_FILE}; it was saved without a value head, so resume it "
            "with an algorithm that has none (or load it with value_head=None)"
        )
    if scheduler is not None and found.torch["scheduler.pt"] is None:
        raise ValueError(f"{path} was saved without a scheduler; pass scheduler=None")
    _load_weights(path, found.weights, model, value_head)
    if optimizer is not None:
        try:
            optimizer.load_state_dict(found.torch["optimizer.pt"])
        except (ValueError, KeyError) as e:
            raise ValueError(
                f"{path / 'optimizer.pt'} does not fit the optimizer ({_brief(e)}); "
                "build the optimizer over the same parameters as the saved run"
            ) from e
    if scheduler is not None:
        scheduler.load_state_dict(found.torch["scheduler.pt"])
    if restore_rng:
        _set_rng_state(found.torch["rng.pt"], generators)
    return found.state


def verify_checkpoint(path: str | Path, *, warn: Warn = _warn) -> None:
    """Check a checkpoint without loading it into anything; raise `CheckpointDamaged` if it is damaged.

    The same checks as `load_checkpoint`: the manifest's shape, each file's size and hash, and
    that every file parses (the torch files are read in full, so this costs a load's memory).
    """
    _read_checkpoint(Path(path), TORCH_FILES, warn)


def resume_latest(
    run_dir: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    value_head: torch.nn.Module | None = None,
    generators: Mapping[str, torch.Generator] | None = None,
    warn: Warn = _warn,
) -> Resumed | None:
    """Load the newest intact checkpoint of `run_dir` (see `load_checkpoint`); None when it has none.

    Checkpoints are tried newest first. Each damaged one that is newer than the one loaded is
    moved aside to `step_XXXXXX.damaged` (kept for inspection, and out of the way of the
    resumed run's saves and of pruning), and `warn` names it, the broken file and why. Temp
    directories of interrupted writes are never candidates. When every checkpoint is damaged,
    `NoIntactCheckpoint` lists each with its reason, and nothing is moved or deleted.
    """
    tried: list[tuple[Path, str]] = []
    for path in _step_dirs(run_dir):
        try:
            state = load_checkpoint(
                path, model=model, optimizer=optimizer, scheduler=scheduler,
                value_head=value_head, generators=generators, warn=warn,
            )  # fmt: skip
        except CheckpointDamaged as e:
            tried.append((path, e.reason))
            continue
        damaged = []
        for bad, reason in tried:
            try:
                kept = _set_aside(bad)
                where = f"kept as {kept.name} for inspection"
            except OSError as e:
                kept, where = bad, f"could not move it aside ({e.strerror}), so it stays in place"
            warn(f"checkpoint {bad.name} is damaged: {reason}; resuming from {path.name} ({where})")
            damaged.append((kept, reason))
        return Resumed(path=path, state=state, damaged=damaged)
    if tried:
        raise NoIntactCheckpoint(Path(run_dir) / CHECKPOINTS, tried)
    return None


def export_hf(model: torch.nn.Module, tokenizer: Any, out_dir: str | Path) -> Path:
    """Export `model` (and `tokenizer`, with its chat template) as a normal Hugging Face directory.

    A PEFT model is merged first, on a deep copy, so the live training model keeps its adapter.
    The directory is written atomically (temp dir + rename); an existing `out_dir` is replaced.
    `AutoModelForCausalLM.from_pretrained(out_dir)` and `AutoTokenizer.from_pretrained(out_dir)`
    load the result.
    """
    out = Path(out_dir)
    export = _merged_copy(model)
    if not hasattr(export, "save_pretrained"):
        raise TypeError(
            f"export_hf needs a transformers model (with save_pretrained), got {type(model).__name__}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_tmp(out.parent)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        export.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for f in tmp.rglob("*"):
            if f.is_file():
                _fsync_file(f)
        fsync_dir(tmp)
        _swap_into_place(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


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


def _is_peft(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _save_weights(
    tmp: Path, model: torch.nn.Module, value_head: torch.nn.Module | None, adapter_only: bool
) -> None:
    if adapter_only:
        if not _is_peft(model):
            raise ValueError(
                f"adapter_only=True needs a PEFT model, got {type(model).__name__}; "
                "wrap it with peft.get_peft_model or save with adapter_only=False"
            )
        from peft import get_peft_model_state_dict

        adapter = get_peft_model_state_dict(model, save_embedding_layers=False)
        tensors = {k: v.detach().clone().contiguous() for k, v in adapter.items()}
        save_file(tensors, str(tmp / ADAPTER_FILE), metadata={"format": "pt"})
    else:
        # save_model stores tied tensors (embed_tokens / lm_head) once; load_model re-ties them.
        save_model(model, str(tmp / MODEL_FILE), metadata={"format": "pt"})
    if value_head is not None:
        save_model(value_head, str(tmp / VALUE_HEAD_FILE), metadata={"format": "pt"})


def _load_weights(
    path: Path, weights: str, model: torch.nn.Module, value_head: torch.nn.Module | None
) -> None:
    if weights == ADAPTER_FILE:
        if not _is_peft(model):
            raise ValueError(
                f"{path} holds adapter weights only; build the same PEFT model "
                f"(peft.get_peft_model with the run's LoRA config) before loading, got {type(model).__name__}"
            )
        from peft import set_peft_model_state_dict

        result: Any = set_peft_model_state_dict(model, load_file(str(path / ADAPTER_FILE)))
        if result.unexpected_keys:
            raise RuntimeError(
                f"adapter in {path} does not fit the model (unexpected keys: "
                f"{sorted(result.unexpected_keys)[:5]}); use the LoRA config of the saved run"
            )
    else:
        _load_module(model, path / MODEL_FILE)
    if value_head is not None:
        _load_module(value_head, path / VALUE_HEAD_FILE)


def _load_module(module: torch.nn.Module, file: Path) -> None:
    try:
        load_model(module, str(file), strict=True)
    except RuntimeError as e:
        raise RuntimeError(
            f"{file} does not fit {type(module).__name__} ({_brief(e)}); "
            "build the model with the configuration of the saved run"
        ) from e


def _rng_state(generators: Mapping[str, torch.Generator] | None) -> dict[str, Any]:
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    return state


def _set_rng_state(state: dict[str, Any], generators: Mapping[str, torch.Generator] | None) -> None:
    random.setstate(state["python"])
    npd = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": npd["bit_generator"],
            "state": {"key": npd["key"].numpy().astype(np.uint32), "pos": npd["pos"]},
            "has_gauss": npd["has_gauss"],
            "gauss": npd["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)
    saved = state["generators"]
    for name, gen in (generators or {}).items():
        if name not in saved:
            raise KeyError(
                f"checkpoint has no state for generator {name!r}; saved: {sorted(saved)}"
            )
        gen.set_state(saved[name])


def _merged_copy(model: torch.nn.Module) -> Any:
    if not _is_peft(model):
        return model
    merged: Any = copy.deepcopy(model)
    return merged.merge_and_unload()


def _swap_into_place(tmp: Path, final: Path) -> None:
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


def _prune(run_dir: str | Path, keep_last: int, keep: Path) -> None:
    found = list_checkpoints(run_dir)
    for _, p in found[:-keep_last]:
        if p != keep:
            shutil.rmtree(p, ignore_errors=True)


@dataclass(frozen=True)
class _Found:
    """A verified checkpoint, parsed: which weights file, whether a value head, state, torch files."""

    weights: str
    has_head: bool
    state: dict[str, Any]
    torch: dict[str, Any]


def _read_checkpoint(path: Path, need: tuple[str, ...] | list[str], warn: Warn) -> _Found:
    """Check the manifest and every file's size and hash, then parse what a load will use."""
    manifest = _read_manifest(path)
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
    return _Found(weights, has_head, state, {name: _read_torch(path, name) for name in need})


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
        raise CheckpointDamaged(path, f"manifest {COMPLETE} cannot be read ({_brief(e)})") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointDamaged(path, f"manifest {COMPLETE} is not valid JSON ({e})") from None
    m = _STEP_DIR.match(path.name)
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
    if manifest.get("weights") not in ("full", "adapter"):
        return f"has weights={manifest.get('weights')!r}, expected 'full' or 'adapter'"
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
    weights = ADAPTER_FILE if manifest["weights"] == "adapter" else MODEL_FILE
    missing = [n for n in (weights, *TORCH_FILES, STATE_FILE) if n not in files]
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
        return f"{file.name} cannot be read ({_brief(e)})"
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
        raise CheckpointDamaged(path, f"{name} cannot be loaded ({_brief(e)})") from None


def _read_torch(path: Path, name: str) -> Any:
    if not (path / name).is_file():
        raise CheckpointDamaged(path, f"{name} is missing")
    try:
        return _torch_load(path / name)
    except Exception as e:  # torch.load raises RuntimeError, EOFError, UnpicklingError, ...
        raise CheckpointDamaged(path, f"{name} cannot be loaded ({_brief(e)})") from None


def _read_state(path: Path) -> dict[str, Any]:
    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointDamaged(path, f"{STATE_FILE} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointDamaged(path, f"{STATE_FILE} cannot be read ({_brief(e)})") from None
    if not isinstance(state, dict):
        raise CheckpointDamaged(
            path, f"{STATE_FILE} holds a JSON {type(state).__name__}, expected an object"
        )
    return state


def _brief(e: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    first = (str(e).strip().splitlines() or [""])[0]
    text = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _seal(path: Path) -> dict[str, Any]:
    """fsync a written file and return its manifest entry (size and hash, from one read)."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, HASHES[HASH]).hexdigest()
        size = f.tell()
        os.fsync(f.fileno())
    return {"size": size, HASH: digest}


def _step_dirs(run_dir: str | Path) -> list[Path]:
    """Every `step_XXXXXX` directory of a run, manifest or not, newest first."""
    root = Path(run_dir) / CHECKPOINTS
    found = []
    for p in root.iterdir() if root.is_dir() else []:
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found, reverse=True)]


def _set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to `<name>.damaged` (or `.damaged-2`, ...) and return the new path."""
    n = 1
    aside = path.with_name(f"{path.name}.damaged")
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{n}")
    os.rename(path, aside)
    fsync_dir(path.parent)
    return aside


def _keep_if_damaged(final: Path) -> None:
    """Before a save replaces `final`: move it aside instead when it does not verify."""
    if not final.exists():
        return
    try:
        _read_checkpoint(final, TORCH_FILES, warn=lambda _message: None)
    except CheckpointDamaged as e:
        aside = _set_aside(final)
        _warn(
            f"checkpoint {final.name} is damaged ({e.reason}); moved it to {aside.name} for "
            "inspection instead of overwriting it"
        )


def _torch_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _torch_load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
