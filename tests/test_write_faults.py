"""A disk that takes no more data (full, over quota, read-only) ends a command with one line that
names the file and the fix, exit 1 and no traceback, and leaves what was written before intact:
eval's results.jsonl, a checkpoint, metrics.jsonl and the exported final/. The fault is injected
(`OSError(ENOSPC)` at the write, or safetensors' own error text) where each writer writes."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import small_model

from looprl.cli.main import main
from looprl.eval import summary as eval_summary
from looprl.files import WriteFault, write_fault_line, writing
from looprl.trainer.checkpoint import single
from looprl.trainer.checkpoint.verify import verify_checkpoint
from looprl.trainer.logger import MetricsLogger, read_metrics

LENGTH_ENV = str(Path(__file__).parent / "envs" / "length_env.py")


def _full() -> OSError:
    """What `write` or `fsync` raise on a full disk: an errno, no file name."""
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_writing_names_the_path_of_a_write_fault_and_passes_other_errors(tmp_path) -> None:
    target = tmp_path / "results.jsonl"
    with pytest.raises(WriteFault) as fault, writing(target):
        raise _full()
    assert (fault.value.errno, fault.value.filename) == (errno.ENOSPC, str(target))
    rust = RuntimeError("Error while serializing: I/O error: Disk quota exceeded (os error 122)")
    with pytest.raises(WriteFault) as fault, writing(target):
        raise rust  # safetensors' error type, with the errno in its text
    assert fault.value.errno == errno.EDQUOT
    with pytest.raises(PermissionError), writing(target):
        raise PermissionError(errno.EACCES, "Permission denied")
    line = write_fault_line(WriteFault(errno.EROFS, "x", "/mnt/ro/m.jsonl"), "rerun")
    assert line == (
        "error: read-only file system writing /mnt/ro/m.jsonl — make it writable, then rerun "
        "(what was written before is intact)"
    )
    assert write_fault_line(ValueError("bad"), "rerun") is None


def test_eval_on_a_full_disk_stops_with_one_line_and_keeps_the_groups_written(
    tmp_path, monkeypatch, capsys
) -> None:
    calls = {"fsync": 0}

    def fsync(fd: int) -> None:
        calls["fsync"] += 1
        if calls["fsync"] >= 2:  # the second group's lines find the disk full
            raise _full()
        os.fsync(fd)

    monkeypatch.setattr(eval_summary, "os", SimpleNamespace(fsync=fsync))
    out = tmp_path / "ev"
    argv = ["eval", "calculator", "--policy", "looprl.sft.teachers:calculator", "-n", "3"]
    assert main([*argv, "-r", "2", "--concurrency", "1", "--output", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: no space left on device writing {out / 'results.jsonl'} — free space on that "
        "disk, then rerun with --resume (what was written before is intact)"
    ]
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) >= 2 and all(json.loads(line)["task"]["id"] for line in lines)
    assert json.loads((out / "metadata.json").read_text())["status"] == "crashed"


@pytest.mark.slow
def test_a_checkpoint_on_a_full_disk_stops_train_and_keeps_the_last_one(
    tmp_path, monkeypatch, capsys
) -> None:
    real = single.torch_save_synced

    def torch_save_synced(obj: Any, path: Path) -> None:
        if "step_000002" in str(path):
            raise _full()
        real(obj, path)

    monkeypatch.setattr(single, "torch_save_synced", torch_save_synced)
    run = tmp_path / "run"
    argv = ["train", "--model.name", "tiny", "--env.name", LENGTH_ENV, "--run-dir", str(run)]
    argv += ["--rollout.tasks_per_step", "2", "--rollout.rollouts_per_task", "2"]
    argv += ["--trainer.steps", "2", "--trainer.eval_every", "0", "--trainer.save_every", "1"]
    assert main([*argv, "--run.tensorboard", "false"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    ckpts = run / "checkpoints"
    assert err == [
        f"error: no space left on device writing {ckpts / 'step_000002'} — free space on that "
        "disk, then rerun with --resume (what was written before is intact)"
    ]
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_000001"]  # no half-written one
    verify_checkpoint(ckpts / "step_000001")  # the last one is whole (raises if damaged)
    assert not (run / "final").exists()
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


class _FullFile:
    """A metrics file on a disk that has just filled up."""

    closed = False

    def write(self, data: Any) -> int:
        raise _full()

    def close(self) -> None:
        self.closed = True


def test_metrics_on_a_full_disk_name_the_file_and_keep_the_rows_before(tmp_path) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=False, console=False)
    logger.log(1, {"reward/mean": 0.5})
    real, logger._file = logger._file, _FullFile()  # type: ignore[assignment]
    real.close()
    with pytest.raises(WriteFault) as fault:
        logger.log(2, {"reward/mean": 0.6})
    assert fault.value.filename == str(tmp_path / "metrics.jsonl")
    logger.close()  # nothing refused is flushed again on the way out
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]


def test_an_export_on_a_full_disk_names_final_and_keeps_the_previous_one(
    tmp_path, monkeypatch
) -> None:
    from test_checkpoint import tiny_tokenizer

    model, out = small_model(), tmp_path / "final"
    single.export_hf(model, tiny_tokenizer(), out)
    before = sorted(p.name for p in out.iterdir())

    def save_pretrained(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(type(model), "save_pretrained", save_pretrained)
    with pytest.raises(WriteFault) as fault:
        single.export_hf(model, tiny_tokenizer(), out)
    assert (fault.value.errno, fault.value.filename) == (errno.ENOSPC, str(out))
    assert sorted(p.name for p in out.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["final"]  # no scratch directory left
