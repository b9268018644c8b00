"""Sharded checkpoints under torchrun: `torch.distributed.checkpoint` (DCP), atomic and verified.

With N > 1 processes no rank holds the full weights or optimizer state, so each rank writes its
own shards through DCP. Layout of one checkpoint, `run_dir/checkpoints/step_000120/`:

- `.metadata` and `__R_0.distcp` (one per rank R): DCP's files, holding the shards of the
  policy, its AdamW state, the reference model and the PPO value head (where present), under
  the names `policy.`, `reference.`, `value_head.` + each module's own parameter names
- `rng_rank{R}.pt`: each rank's RNG states (python, numpy, torch CPU/CUDA)
- `scheduler.pt` and `state.json` (step, task cursor), written by rank 0
- `COMPLETE`, the manifest, written last by rank 0: `weights: "sharded"`, `world: N`, and each
  file's size and sha256, as for single-process checkpoints

The write is atomic as in `looprl.trainer.checkpoint.single`: every rank writes into rank 0's
`step_000120.tmp-<pid>/` (so with several nodes the run directory must be on a shared file
system), rank 0 seals the files and writes the manifest once every rank is done, then renames
the directory into place. Resuming verifies the newest checkpoint's manifest and hashes on rank
0 (falling back past damaged ones, as `resume_latest` does) and needs the same N: DCP could
reshard, but the batch split, the RNG streams and the tested exactness are those of N ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from looprl.files import writing
from looprl.trainer import distributed as D
from looprl.trainer.checkpoint.files import (
    COMPLETE,
    STATE_FILE,
    checkpoint_dir,
    clean_stale_tmp,
    fsync_dir,
    prune_checkpoints,
    set_aside,
    step_dirs,
    swap_into_place,
    torch_save_synced,
    write_text_synced,
)
from looprl.trainer.checkpoint.rng import rng_state, set_rng_state
from looprl.trainer.checkpoint.single import Resumed, resume_latest, set_aside_damaged
from looprl.trainer.checkpoint.verify import (
    MANIFEST_FORMAT,
    CheckpointDamaged,
    NoIntactCheckpoint,
    Warn,
    WorldSizeMismatch,
    checkpoint_world,
    default_warn,
    read_sharded,
    rng_file,
    seal_file,
)
from looprl.trainer.config import ConfigError

T = TypeVar("T")


def save_sharded(
    d: D.Dist,
    run_dir: str | Path,
    step: int,
    *,
    modules: Mapping[str, torch.nn.Module | None],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extra_state: Mapping[str, Any],
    keep_last: int | None = 3,
) -> Path:
    """Every rank writes its shards of `step`'s checkpoint; rank 0 seals it and renames it into place.

    `modules` names the sharded modules (`policy`, `reference`, `value_head`; None entries are
    skipped); `optimizer` must be built over their parameters. Call on every rank at once.
    Returns the checkpoint directory. A failure on any rank removes the temporary directory and
    raises on every rank, leaving the previous checkpoints as they were.
    """
    final = checkpoint_dir(run_dir, step)
    with writing(final):  # a full disk on any rank names the checkpoint
        tmp = _on_main(d, lambda: _make_tmp(final))
        import torch.distributed.checkpoint as dcp

        problem: BaseException | None = None
        try:
            model_sd, optim_sd = _state_dicts(modules, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
            torch_save_synced(rng_state(None), tmp / rng_file(d.rank))
        except Exception as exc:
            problem = exc
        failed = [e for e in D.gather_objects(d, problem and f"rank {d.rank}: {problem}") if e]
        if failed:
            if d.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise problem or RuntimeError("a sharded checkpoint failed on: " + "; ".join(failed))

        def seal() -> Path:
            state = {**extra_state, "step": step}
            torch_save_synced(
                scheduler.state_dict() if scheduler is not None else None, tmp / "scheduler.pt"
            )
            write_text_synced(tmp / STATE_FILE, json.dumps(state, indent=2, sort_keys=True))
            files = {f.name: seal_file(f) for f in sorted(tmp.iterdir())}
            meta = {"format": MANIFEST_FORMAT, "step": step, "weights": "sharded", "world": d.world,
                    "time": time.time(), "files": files}  # fmt: skip
            write_text_synced(tmp / COMPLETE, json.dumps(meta, indent=1))
            fsync_dir(tmp)
            _keep_if_damaged(final, d.world)
            swap_into_place(tmp, final)
            if keep_last is not None:
                prune_checkpoints(run_dir, keep_last, keep=final)
            return final

        return _on_main(d, seal, cleanup=lambda: shutil.rmtree(tmp, ignore_errors=True))


def resume_any(
    d: D.Dist | None,
    run_dir: str | Path,
    *,
    modules: Mapping[str, torch.nn.Module | None],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    warn: Warn,
) -> Resumed | None:
    """Load the newest intact checkpoint of `run_dir`; None when it has none.

    With one process (`d` None) this is `resume_latest`. Under torchrun rank 0 verifies (manifest, sizes, hashes, world size) newest first, moves damaged newer ones
    aside and `warn`s about each, as `resume_latest` does; then every rank loads its shards,
    the scheduler and its own RNG states. Raises `NoIntactCheckpoint` when none is intact and
    `WorldSizeMismatch` when the checkpoint was written by another number of processes.
    """
    if d is None:
        return resume_latest(
            run_dir, model=modules["policy"], optimizer=optimizer,  # type: ignore[arg-type]
            scheduler=scheduler, value_head=modules.get("value_head"), warn=warn,
        )  # fmt: skip
    found = _on_main(d, lambda: find_intact(run_dir, d.world, warn))
    if found is None:
        return None
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model_sd, optim_sd = _state_dicts(modules, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=found.path)
    set_state_dict(
        _container(modules), optimizer,
        model_state_dict=state["model"], optim_state_dict=state["optim"],
    )  # fmt: skip
    if scheduler is not None:
        scheduler.load_state_dict(_load(found.path / "scheduler.pt"))
    set_rng_state(_load(found.path / rng_file(d.rank)), None)
    return found


def check_resume_world(run_dir: str | Path, world: int) -> None:
    """Raise a `ConfigError` when the newest checkpoint of `run_dir` was written by another N.

    Cheap (reads one manifest), so `looprl train --resume` refuses before it starts any process.
    A run without checkpoints, or whose newest manifest cannot be read, passes: resuming then
    starts from step 0 or reports the damage as usual.
    """
    for path in step_dirs(run_dir):
        saved = checkpoint_world(path)
        if saved is None:
            continue
        if saved != world:
            raise ConfigError(str(WorldSizeMismatch(path, saved, world)))
        return


def find_intact(run_dir: str | Path, world: int, warn: Warn) -> Resumed | None:
    """The newest sharded checkpoint of `run_dir` written by `world` processes that verifies, with
    the damaged newer ones moved aside (each `warn`ed about); None when the run has none.

    Raises `NoIntactCheckpoint` when there are checkpoints but none is intact.
    """
    tried: list[tuple[Path, str]] = []
    for path in step_dirs(run_dir):
        try:
            state = read_sharded(path, world)
        except CheckpointDamaged as e:
            tried.append((path, e.reason))
            continue
        return Resumed(path=path, state=state, damaged=set_aside_damaged(tried, path, warn))
    if tried:
        raise NoIntactCheckpoint(Path(run_dir) / "checkpoints", tried)
    return None


def _container(modules: Mapping[str, torch.nn.Module | None]) -> torch.nn.ModuleDict:
    """One module over the sharded ones, so their names do not collide in one state dict."""
    return torch.nn.ModuleDict({k: m for k, m in modules.items() if m is not None})


def _state_dicts(
    modules: Mapping[str, torch.nn.Module | None], optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], Any]:
    """The sharded model and optimizer state dicts (DTensor shards, canonical names)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(_container(modules), optimizer)


def _make_tmp(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_tmp(final.parent)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    tmp.mkdir()
    return tmp


def _keep_if_damaged(final: Path, world: int) -> None:
    """Before a save replaces `final`: move it aside instead when it does not verify."""
    if not final.exists():
        return
    try:
        read_sharded(final, world)
    except (CheckpointDamaged, WorldSizeMismatch) as e:
        aside = set_aside(final)
        default_warn(f"checkpoint {final.name} does not verify ({e}); moved it to {aside.name}")


def _on_main(d: D.Dist, work: Callable[[], T], cleanup: Callable[[], None] | None = None) -> T:
    """Run `work` on rank 0 and hand every rank its result.

    When it raises, rank 0 raises that error (the one the user reads) and the other ranks
    leave quietly with `SystemExit(1)`, so the job ends on every rank at once.
    """
    box: list[Any] = [None, None]
    error: BaseException | None = None
    if d.is_main:
        try:
            box[0] = work()
        except BaseException as exc:
            if cleanup is not None:
                cleanup()
            error, box = exc, [None, f"{type(exc).__name__}: {exc}"]
    box = D.from_main(d, box)
    if error is not None:
        raise error
    if box[1] is not None:
        raise SystemExit(1)
    return box[0]


def _load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)
