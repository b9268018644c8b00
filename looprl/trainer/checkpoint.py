"""Atomic training checkpoints (weights, optimizer, scheduler, RNG, trainer state) and HF export.

Layout of one checkpoint, `run_dir/checkpoints/step_000120/`:

- `model.safetensors` (full weights, tied tensors stored once) or `adapter.safetensors`
  (PEFT adapter weights only, when saved with `adapter_only=True`)
- `value_head.safetensors` (optional, PPO)
- `optimizer.pt`, `scheduler.pt` (`torch.save` of their state dicts)
- `rng.pt` (python `random`, numpy, torch CPU, CUDA and any named `torch.Generator` states)
- `state.json` (the trainer's JSON state: step, task cursor, ...)
- `COMPLETE` (written last; a directory without it is never loaded)

Everything is written into `step_000120.tmp-<pid>/`, fsynced, then renamed into place, so a
run killed at any moment (`kill -9` included) leaves either the old set of checkpoints or the
new one, never a half-written checkpoint that `latest_checkpoint` would pick.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model

CHECKPOINTS = "checkpoints"
COMPLETE = "COMPLETE"
MODEL_FILE = "model.safetensors"
ADAPTER_FILE = "adapter.safetensors"
VALUE_HEAD_FILE = "value_head.safetensors"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_SCRATCH_DIR = re.compile(r"^(?:step_\d+\.tmp|\..+\.(?:tmp|old))-(\d+)$")


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of `step` lives: `run_dir/checkpoints/step_{step:06d}`."""
    return Path(run_dir) / CHECKPOINTS / f"step_{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as (step, path), oldest first; temp dirs are ignored."""
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
    """The complete checkpoint with the highest step, or None when the run has none."""
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
        _write_text(tmp / "state.json", state_text)
        meta = {"step": step, "weights": "adapter" if adapter_only else "full", "time": time.time()}
        _write_text(tmp / COMPLETE, json.dumps(meta))
        fsync_dir(tmp)
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
) -> dict[str, Any]:
    """Restore a checkpoint written by `save_checkpoint` in place and return its `state.json`.

    Weights are copied into the existing parameters (optimizers built on them stay valid).
    An adapter checkpoint needs `model` to be a PEFT model with the same adapter config. Pass
    the optimizer and scheduler built exactly as in the original run; `generators` must name
    the same generators that were saved. RNG states are restored unless `restore_rng=False`.
    """
    path = Path(path)
    if not (path / COMPLETE).is_file():
        raise FileNotFoundError(
            f"{path} is not a complete checkpoint (no {COMPLETE} marker); "
            "use latest_checkpoint(run_dir) to find the newest complete one"
        )
    _load_weights(path, model, value_head)
    if optimizer is not None:
        optimizer.load_state_dict(_torch_load(path / "optimizer.pt"))
    if scheduler is not None:
        sched_state = _torch_load(path / "scheduler.pt")
        if sched_state is None:
            raise ValueError(f"{path} was saved without a scheduler; pass scheduler=None")
        scheduler.load_state_dict(sched_state)
    if restore_rng:
        _set_rng_state(_torch_load(path / "rng.pt"), generators)
    state: dict[str, Any] = json.loads((path / "state.json").read_text(encoding="utf-8"))
    return state


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
        _fsync_file(tmp / ADAPTER_FILE)
    else:
        # save_model stores tied tensors (embed_tokens / lm_head) once; load_model re-ties them.
        save_model(model, str(tmp / MODEL_FILE), metadata={"format": "pt"})
        _fsync_file(tmp / MODEL_FILE)
    if value_head is not None:
        save_model(value_head, str(tmp / VALUE_HEAD_FILE), metadata={"format": "pt"})
        _fsync_file(tmp / VALUE_HEAD_FILE)


def _load_weights(path: Path, model: torch.nn.Module, value_head: torch.nn.Module | None) -> None:
    if (path / ADAPTER_FILE).is_file():
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
    elif (path / MODEL_FILE).is_file():
        load_model(model, str(path / MODEL_FILE), strict=True)
    else:
        raise FileNotFoundError(f"{path} holds neither {MODEL_FILE} nor {ADAPTER_FILE}")
    has_head = (path / VALUE_HEAD_FILE).is_file()
    if value_head is not None and not has_head:
        raise FileNotFoundError(
            f"{path} has no {VALUE_HEAD_FILE}; was it saved without value_head?"
        )
    if value_head is not None:
        load_model(value_head, str(path / VALUE_HEAD_FILE), strict=True)


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
