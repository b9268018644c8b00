"""W&B logging (`run.wandb = true`) in offline mode: what reaches the offline run, quietly, and exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from looprl.trainer.config import load_config
from looprl.trainer.wandb_logger import (
    RUN_ID_FILE,
    TABLE_COLUMNS,
    WandbLogger,
    for_run,
    resolve_mode,
)
from looprl.types import EpisodeResult, Message, Task

LENGTH_ENV = str(Path(__file__).parent / "envs" / "length_env.py")


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """W&B offline, with every directory it writes under tmp_path (never the home directory);
    yields WANDB_DIR, where the offline runs go.

    wandb.init puts its service's address in WANDB_SERVICE, where a child process would find it
    and log through this process's service instead of its own; it is removed after each test.
    """
    pytest.importorskip("wandb")
    home = tmp_path / "wandb_home"
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(home / var.lower()))
    os.environ.pop("WANDB_SERVICE", None)
    yield home / "wandb_dir"
    os.environ.pop("WANDB_SERVICE", None)


def wandb_records(wandb_dir: Path, run_id: str) -> Iterator[Any]:
    """The records of offline run `run_id` under `wandb_dir`: its `run-ID.wandb` file is a 7-byte
    header then LevelDB-log chunks (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) in
    32 KiB blocks, each record a `wandb_internal_pb2.Record` protobuf."""
    from wandb.proto import wandb_internal_pb2

    (path,) = wandb_dir.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, parts = 7, []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        payload, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        parts = [payload] if kind in (1, 2) else [*parts, payload]
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            yield record


def history_and_config(
    wandb_dir: Path, run_dir: Path
) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """{step: {key: value}} of the logged rows, and the run config, read from the offline run of
    looprl run `run_dir` (its W&B id is in the run directory)."""
    history: dict[int, dict[str, Any]] = {}
    config: dict[str, Any] = {}
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    for record in wandb_records(wandb_dir, run_id):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = history.setdefault(record.history.step.num, {})
            for item in record.history.item:
                row[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({u.key: json.loads(u.value_json) for u in updates})
    return history, config


def own_env() -> dict[str, str]:
    """The environment of a child process that starts its own W&B service (see `offline`)."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    return {**env, "OMP_NUM_THREADS": "1"}


def episode(task_id: str, reward: float) -> EpisodeResult:
    prompt = [Message(role="user", content=f"question {task_id}")]
    return EpisodeResult(
        task=Task(task_id, prompt, "4"),
        messages=[*prompt, Message(role="assistant", content="4", raw="The answer is 4.")],
        reward=reward,
        rewards={"correct": reward},
        num_turns=1,
        stop_reason="done",
    )


def test_offline_run_holds_metrics_config_rollouts_and_plot(tmp_path, offline, capfd):
    run_dir = tmp_path / "run"
    logger = WandbLogger(run_dir, config={"trainer": {"steps": 2}}, rollouts=2)
    logger.log(1, {"step": 1, "reward/mean": 0.25, "loss/total": 0.5, "policy/kl": None})
    logger.log(2, {"step": 2, "reward/mean": 0.75, "eval/reward": 1.0})
    logger.log_rollouts(2, [episode(f"t{i}", i / 4) for i in range(4)])
    png = tmp_path / "curves.png"
    from matplotlib.figure import Figure

    Figure(figsize=(1, 1)).savefig(png)
    logger.log_plot(2, png)
    logger.close()
    import wandb

    wandb.teardown()  # the service writes the run's file on its own time: wait for it, as exit does
    assert capfd.readouterr() == ("", "")  # no banner, no summary, no captured console

    history, config = history_and_config(offline, run_dir)
    assert history[1]["reward/mean"] == 0.25 and history[1]["loss/total"] == 0.5
    assert "policy/kl" not in history[1]  # null values are left out
    assert history[2]["reward/mean"] == 0.75 and history[2]["eval/reward"] == 1.0
    assert history[2]["rollouts/_type"] == "table-file"
    assert history[2]["plot/_type"] == "image-file"
    assert config["trainer"] == {"steps": 2}
    (files_dir,) = offline.glob("wandb/offline-run-*/files")
    table = json.loads((files_dir / history[2]["rollouts/path"]).read_text())
    assert table["columns"] == list(TABLE_COLUMNS)
    # two episodes of the four, spread over the batch: the first and the third
    assert [row[1] for row in table["data"]] == ["t0", "t2"]
    assert table["data"][0][8] == "user: question t0"
    assert table["data"][0][9] == "assistant: The answer is 4."  # what the model sampled
    assert (files_dir / history[2]["plot/path"]).is_file()


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path, offline, monkeypatch):
    monkeypatch.delenv("WANDB_DIR")  # without it (or run.wandb_dir) the files go in the run
    run_dir = tmp_path / "run"
    first = WandbLogger(run_dir, config={})
    first.log(1, {"reward/mean": 0.1})
    first.close()
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    again = WandbLogger(run_dir, config={}, resume=True)
    assert again.run.id == run_id
    again.log(2, {"reward/mean": 0.2})
    again.close()
    assert len(list(run_dir.glob(f"wandb/offline-run-*-{run_id}*"))) == 2  # offline: one a start
    fresh = WandbLogger(tmp_path / "other", config={})
    assert fresh.run.id != run_id
    fresh.close()


def test_mode_is_offline_unless_asked(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert resolve_mode(None) == "offline"
    assert resolve_mode("online") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode(None) == "disabled"
    monkeypatch.setenv("WANDB_MODE", "sometimes")
    with pytest.raises(ValueError, match=r"'sometimes' \(from WANDB_MODE\); choose one of"):
        resolve_mode(None)
    with pytest.raises(Exception, match=r"run.wandb_mode"):
        load_config(None, {"run.wandb_mode": "sometimes"})


def test_without_wandb_installed_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails
    run = load_config(None, {"run.wandb": True}).run
    with pytest.raises(ImportError, match=r"pip install -e '\.\[wandb\]'"):
        for_run(run, tmp_path, {}, resume=False)
    assert for_run(load_config(None, {}).run, tmp_path, {}, resume=False) is None


@pytest.mark.slow
def test_looprl_train_with_run_wandb_logs_quietly_and_exits(tmp_path, offline):
    """A real 2-step run: every metrics row reaches W&B, nothing of W&B reaches the console."""
    run_dir = tmp_path / "run"
    args = [
        sys.executable, "-m", "looprl.cli.main", "train", "--run-dir", str(run_dir),
        "--model.name", "tiny", "--env.name", LENGTH_ENV, "--rollout.tasks_per_step", "2",
        "--rollout.rollouts_per_task", "2", "--trainer.steps", "2", "--trainer.eval_every", "0",
        "--trainer.eval_tasks", "2", "--trainer.save_every", "2", "--run.tensorboard", "false",
        "--run.wandb", "true", "--run.wandb_rollouts", "2",
    ]  # fmt: skip
    # the timeout only catches a hang at exit; the run itself takes seconds
    done = subprocess.run(args, capture_output=True, text=True, env=own_env(), timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    output = done.stdout + done.stderr
    assert not [line for line in output.splitlines() if line.startswith("wandb")], output[-2000:]
    assert "W&B offline" in output  # looprl's own start-up summary says where it goes

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    history, config = history_and_config(offline, run_dir)
    for row in rows:
        logged = history[row["step"]]
        for key, value in row.items():
            if key != "step" and value is not None:
                assert logged[key] == pytest.approx(value), key
    assert history[2]["plot/_type"] == "image-file"
    assert all(history[s]["rollouts/nrows"] == 2 for s in (1, 2))
    assert config["config"]["run"]["wandb"] is True
    assert config["algorithm"] == json.loads((run_dir / "config.json").read_text())["algorithm"]


def test_a_run_that_dies_without_close_still_exits_and_keeps_its_rows(tmp_path, offline):
    """wandb's exit hook finishes a run the trainer never closed (a crash), without a hang."""
    run_dir = tmp_path / "run"
    script = (
        "from looprl.trainer.wandb_logger import WandbLogger\n"
        f"logger = WandbLogger({str(run_dir)!r}, config={{}})\n"
        "logger.log(1, {'reward/mean': 0.5})\n"
        "raise SystemExit(3)\n"
    )
    # the timeout only catches a hang at exit
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=own_env()
    )
    assert done.returncode == 3 and done.stdout == "", done.stderr[-2000:]
    assert not [line for line in done.stderr.splitlines() if line.startswith("wandb")]
    history, _ = history_and_config(offline, run_dir)
    assert history[1]["reward/mean"] == 0.5
