"""Sharded checkpoints' manifests without processes: world size checks, damage and fallback.

The checkpoints here are written by hand in the layout `save_sharded` leaves (DCP files, one RNG
file per rank, scheduler, state, manifest); the real 2-process save and resume are in
tests/test_distributed.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from looprl.trainer.checkpoint import single as ckpt
from looprl.trainer.checkpoint.files import checkpoint_dir
from looprl.trainer.checkpoint.sharded import check_resume_world, find_intact
from looprl.trainer.checkpoint.verify import (
    CheckpointDamaged,
    WorldSizeMismatch,
    read_sharded,
    seal_file,
)
from looprl.trainer.config import ConfigError


def fake_sharded(run_dir: Path, step: int, world: int = 2, *, drop: str | None = None) -> Path:
    """A sharded checkpoint directory as `save_sharded` writes it, with made-up file contents."""
    path = checkpoint_dir(run_dir, step)
    path.mkdir(parents=True)
    names = [".metadata", "scheduler.pt", "state.json"]
    names += [f"__{r}_0.distcp" for r in range(world)] + [f"rng_rank{r}.pt" for r in range(world)]
    for name in names:
        text = json.dumps({"step": step, "cursor": 3 * step}) if name == "state.json" else name
        (path / name).write_text(text)
    files = {name: seal_file(path / name) for name in names if name != drop}
    meta = {"format": 2, "step": step, "weights": "sharded", "world": world, "files": files}
    (path / "COMPLETE").write_text(json.dumps(meta))
    return path


def test_a_sharded_checkpoint_verifies_and_names_its_world(tmp_path: Path) -> None:
    path = fake_sharded(tmp_path, 2)
    assert read_sharded(path, 2) == {"step": 2, "cursor": 6}
    with pytest.raises(WorldSizeMismatch, match=r"written by 2 processes .* this run has 3"):
        read_sharded(path, 3)
    check_resume_world(tmp_path, 2)  # the same N passes
    with pytest.raises(ConfigError) as err:
        check_resume_world(tmp_path, 1)
    text = str(err.value)
    assert "\n" not in text and "looprl train --nproc 2 --resume" in text and "step_000002" in text


def test_one_process_refuses_a_sharded_checkpoint_and_n_refuses_a_full_one(tmp_path: Path) -> None:
    import torch

    fake_sharded(tmp_path, 2)
    net = torch.nn.Linear(2, 2)
    with pytest.raises(WorldSizeMismatch, match="--nproc 2 --resume"):
        ckpt.resume_latest(tmp_path, model=net)
    other = tmp_path / "full"
    opt = torch.optim.AdamW(net.parameters())
    ckpt.save_checkpoint(other, 1, model=net, optimizer=opt, scheduler=None, extra_state={})
    with pytest.raises(ConfigError, match=r"written by one process .*\(looprl train --resume\)"):
        check_resume_world(other, 2)
    check_resume_world(tmp_path / "nothing", 2)  # no checkpoints: resuming starts at step 0


def test_a_damaged_sharded_checkpoint_falls_back_and_is_kept(tmp_path: Path) -> None:
    fake_sharded(tmp_path, 2)
    newest = fake_sharded(tmp_path, 4)
    (newest / "__1_0.distcp").write_text("torn")
    warnings: list[str] = []
    found = find_intact(tmp_path, 2, warnings.append)
    assert found is not None and found.path.name == "step_000002"
    assert found.state == {"step": 2, "cursor": 6}
    assert len(warnings) == 1 and "step_000004 is damaged: __1_0.distcp has 4 bytes" in warnings[0]
    assert (tmp_path / "checkpoints" / "step_000004.damaged").is_dir()


def test_a_manifest_that_lists_too_little_is_damage(tmp_path: Path) -> None:
    path = fake_sharded(tmp_path, 2, drop="rng_rank1.pt")
    with pytest.raises(CheckpointDamaged, match="does not list rng_rank1.pt"):
        read_sharded(path, 2)
    meta = json.loads((path / "COMPLETE").read_text())
    (path / "COMPLETE").write_text(json.dumps({**meta, "world": 1}))
    with pytest.raises(CheckpointDamaged, match="world=1"):
        read_sharded(path, 2)
    with pytest.raises(ckpt.NoIntactCheckpoint, match="step_000002"):
        find_intact(tmp_path, 2, lambda _m: None)
