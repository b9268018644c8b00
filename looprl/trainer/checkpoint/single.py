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

This module saves, loads, resumes and exports. The directory layout, synced writes and
crash-safe renames live in `looprl.trainer.checkpoint.files`, the RNG state in
`looprl.trainer.checkpoint.rng`, the manifest and its verification in
`looprl.trainer.checkpoint.verify`; the public names of the first and last are re-exported here. Under torchrun
with several processes checkpoints are sharded instead (`looprl.trainer.checkpoint.sharded`):
the same directory, temp-dir-and-rename and manifest, with `torch.distributed.checkpoint` files.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from looprl.files import writing
from looprl.models.weights import frozen_copy
from looprl.trainer.checkpoint.files import (
    ADAPTER_FILE,
    CHECKPOINTS,
    COMPLETE,
    MODEL_FILE,
    STATE_FILE,
    TORCH_FILES,
    VALUE_HEAD_FILE,
    checkpoint_dir,
    clean_stale_tmp,
    fsync_dir,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    set_aside,
    step_dirs,
    swap_into_place,
    torch_save_synced,
    write_text_synced,
)
from looprl.trainer.checkpoint.rng import rng_state, set_rng_state
from looprl.trainer.checkpoint.verify import (
    HASH,
    HASHES,
    MANIFEST_FORMAT,
    CheckpointDamaged,
    NoIntactCheckpoint,
    Warn,
    brief,
    default_warn,
    read_checkpoint,
    seal_file,
    verify_checkpoint,
)

__all__ = [
    "ADAPTER_FILE",
    "CHECKPOINTS",
    "COMPLETE",
    "HASH",
    "HASHES",
    "MANIFEST_FORMAT",
    "MODEL_FILE",
    "STATE_FILE",
    "TORCH_FILES",
    "VALUE_HEAD_FILE",
    "CheckpointDamaged",
    "NoIntactCheckpoint",
    "Resumed",
    "Warn",
    "checkpoint_dir",
    "clean_stale_tmp",
    "export_hf",
    "fsync_dir",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "resume_latest",
    "save_checkpoint",
    "verify_checkpoint",
]


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
    with writing(final):  # a full disk names the checkpoint; the older ones stay as they are
        tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        try:
            tmp.mkdir()
            _save_weights(tmp, model, value_head, adapter_only)
            torch_save_synced(optimizer.state_dict(), tmp / "optimizer.pt")
            torch_save_synced(
                scheduler.state_dict() if scheduler is not None else None, tmp / "scheduler.pt"
            )
            torch_save_synced(rng_state(generators), tmp / "rng.pt")
            write_text_synced(tmp / STATE_FILE, state_text)
            files = {f.name: seal_file(f) for f in sorted(tmp.iterdir())}  # fsync + size + hash
            meta = {
                "format": MANIFEST_FORMAT,
                "step": step,
                "weights": "adapter" if adapter_only else "full",
                "time": time.time(),
                "files": files,
            }
            write_text_synced(tmp / COMPLETE, json.dumps(meta, indent=1))
            fsync_dir(tmp)
            _keep_if_damaged(final)
            swap_into_place(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    if keep_last is not None:
        prune_checkpoints(run_dir, keep_last, keep=final)
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
    warn: Warn = default_warn,
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
    found = read_checkpoint(path, need, warn)
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
                f"{path / 'optimizer.pt'} does not fit the optimizer ({brief(e)}); "
                "build the optimizer over the same parameters as the saved run"
            ) from e
    if scheduler is not None:
        scheduler.load_state_dict(found.torch["scheduler.pt"])
    if restore_rng:
        set_rng_state(found.torch["rng.pt"], generators)
    return found.state


def set_aside_damaged(
    tried: list[tuple[Path, str]], loaded: Path, warn: Warn
) -> list[tuple[Path, str]]:
    """Move each damaged checkpoint newer than `loaded` aside (`warn` names it and why); returns
    (where each now is, its reason)."""
    damaged = []
    for bad, reason in tried:
        try:
            kept = set_aside(bad)
            where = f"kept as {kept.name} for inspection"
        except OSError as e:
            kept, where = bad, f"could not move it aside ({e.strerror}), so it stays in place"
        warn(f"checkpoint {bad.name} is damaged: {reason}; resuming from {loaded.name} ({where})")
        damaged.append((kept, reason))
    return damaged


def resume_latest(
    run_dir: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    value_head: torch.nn.Module | None = None,
    generators: Mapping[str, torch.Generator] | None = None,
    warn: Warn = default_warn,
) -> Resumed | None:
    """Load the newest intact checkpoint of `run_dir` (see `load_checkpoint`); None when it has none.

    Checkpoints are tried newest first. Each damaged one that is newer than the one loaded is
    moved aside to `step_XXXXXX.damaged` (kept for inspection, and out of the way of the
    resumed run's saves and of pruning), and `warn` names it, the broken file and why. Temp
    directories of interrupted writes are never candidates. When every checkpoint is damaged,
    `NoIntactCheckpoint` lists each with its reason, and nothing is moved or deleted.
    """
    tried: list[tuple[Path, str]] = []
    for path in step_dirs(run_dir):
        try:
            state = load_checkpoint(
                path, model=model, optimizer=optimizer, scheduler=scheduler,
                value_head=value_head, generators=generators, warn=warn,
            )  # fmt: skip
        except CheckpointDamaged as e:
            tried.append((path, e.reason))
            continue
        return Resumed(path=path, state=state, damaged=set_aside_damaged(tried, path, warn))
    if tried:
        raise NoIntactCheckpoint(Path(run_dir) / CHECKPOINTS, tried)
    return None


def export_hf(model: torch.nn.Module, tokenizer: Any, out_dir: str | Path) -> Path:
    """Export `model` (and `tokenizer`, with its chat template) as a normal Hugging Face directory.

    A PEFT model is merged first into a plain copy, so the live training model keeps its adapter.
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
    with writing(out):  # a full disk names the export; a previous one stays as it was
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
            swap_into_place(tmp, out)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out


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
            f"{file} does not fit {type(module).__name__} ({brief(e)}); "
            "build the model with the configuration of the saved run"
        ) from e


def _merged_copy(model: torch.nn.Module) -> Any:
    """The model to export: itself, or for PEFT a plain copy with the LoRA deltas merged in (the
    same merge the engines are synced with, `looprl.models.weights`)."""
    return frozen_copy(model) if _is_peft(model) else model


def _keep_if_damaged(final: Path) -> None:
    """Before a save replaces `final`: move it aside instead when it does not verify."""
    if not final.exists():
        return
    try:
        read_checkpoint(final, TORCH_FILES, warn=lambda _message: None)
    except CheckpointDamaged as e:
        aside = set_aside(final)
        default_warn(
            f"checkpoint {final.name} is damaged ({e.reason}); moved it to {aside.name} for "
            "inspection instead of overwriting it"
        )


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
