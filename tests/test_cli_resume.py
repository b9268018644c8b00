"""`looprl train --resume` cannot hurt a run: a config that changes what it learns is refused,
paths are recorded absolute, a folder with no checkpoint starts and records its config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import LENGTH_ENV, read_metrics

from looprl.cli.main import main
from looprl.trainer.config import load_config
from looprl.trainer.run_config import SAFE_ON_RESUME, absolute_paths, resume_changes


def _recorded_run(run: Path, **fields: object) -> str:
    """A run directory whose config.json records a calculator run (plus `fields`); its text."""
    run.mkdir(parents=True, exist_ok=True)
    cfg = load_config(None, {"env.name": "calculator", "trainer.steps": 10, **fields})
    text = json.dumps({"config": absolute_paths(cfg).model_dump()}, indent=2)
    (run / "config.json").write_text(text)
    return text


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and " — " in lines[0], err
    assert "Traceback" not in err
    return lines[0]


def test_a_config_that_changes_what_the_run_learns_is_refused(capsys, tmp_path):
    run = tmp_path / "run"
    record = _recorded_run(run)
    recipe = tmp_path / "wordle.toml"
    recipe.write_text('[env]\nname = "wordle"\n[model]\nlora = true\n')
    argv = ["train", str(recipe), "--resume", "--run-dir", str(run), "--optim.lr", "3e-5"]
    assert main(argv) == 2
    line = _one_error_line(capsys)
    for needle in ("env.name: saved 'calculator', given 'wordle'", "model.lora: saved False, "
                   "given True", "optim.lr: saved 1e-05, given 3e-05", "--force"):  # fmt: skip
        assert needle in line, line
    assert (run / "config.json").read_text() == record  # nothing written, nothing lost
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]
    # without a TOML file the recorded config is the base: an override alone is compared too
    assert (
        main(["train", "--resume", "--run-dir", str(run), "--rollout.rollouts_per_task", "8"]) == 2
    )
    assert "rollout.rollouts_per_task: saved 4, given 8" in _one_error_line(capsys)
    assert main(["train", "--force", "--run-dir", str(tmp_path / "new")]) == 2
    assert "--force without --resume" in _one_error_line(capsys)
    assert not (tmp_path / "new").exists()


def test_safe_fields_pass_and_force_accepts_the_rest(tmp_path):
    import argparse

    from looprl.cli.train import train_config

    run = tmp_path / "run"
    _recorded_run(run)

    def args(force: bool) -> argparse.Namespace:
        return argparse.Namespace(config=None, resume=True, run_dir=str(run), nproc=1, force=force)

    safe = ["--trainer.steps", "20", "--trainer.eval_every", "5", "--run.wandb", "true",
            "--trainer.micro_batch_tokens", "4096", "--engine.max_concurrency", "8"]  # fmt: skip
    cfg, _ = train_config(args(force=False), safe)
    assert cfg.trainer.steps == 20 and cfg.trainer.eval_every == 5
    cfg, _ = train_config(args(force=True), ["--env.name", "wordle"])
    assert cfg.env.name == "wordle"
    assert resume_changes(json.loads((run / "config.json").read_text())["config"], cfg) == [
        "env.name: saved 'calculator', given 'wordle'"
    ]
    assert all(key.split(".")[0] in cfg.model_dump() for key in SAFE_ON_RESUME)


def test_paths_are_recorded_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "q.jsonl").write_text("{}\n")
    (tmp_path / "my_env.py").write_text("")
    (tmp_path / "model").mkdir()
    cfg = absolute_paths(
        load_config(
            None,
            {
                "model.name": "model",
                "env.name": "my_env.py",
                "env.kwargs": {
                    "questions_path": "data/q.jsonl",
                    "split": "train",
                    "envs": ["calculator", "my_env.py"],
                },
            },
        )  # fmt: skip
    )
    assert cfg.model.name == str(tmp_path / "model") and cfg.env.name == str(tmp_path / "my_env.py")
    assert cfg.env.kwargs == {"questions_path": str(tmp_path / "data" / "q.jsonl"),
                              "split": "train", "envs": ["calculator", str(tmp_path / "my_env.py")]}  # fmt: skip
    assert absolute_paths(load_config(None, {"model.name": "tiny"})).model.name == "tiny"


@pytest.mark.slow
def test_resume_of_an_empty_folder_records_its_config_and_resumes_from_elsewhere(
    tmp_path, monkeypatch, capsys
):
    """`--resume` on a folder with no checkpoint starts at step 0 and writes config.json; the
    run, started with a relative model folder and environment file, resumes from another folder."""
    from looprl.models.tiny import tiny_path

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    shutil.copytree(tiny_path(), first / "models" / "tiny")
    shutil.copy(LENGTH_ENV, first / "length_env.py")
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(first)
    (first / "recipe.toml").write_text(
        '[model]\nname = "models/tiny"\n[env]\nname = "length_env.py"\n'
        "[rollout]\ntasks_per_step = 2\nrollouts_per_task = 2\n[trainer]\nsteps = 1\n"
        "save_every = 1\neval_every = 0\neval_tasks = 2\n[run]\ntensorboard = false\n"
    )
    assert main(["train", "recipe.toml", "--resume", "--run-dir", str(run)]) == 0
    assert "no checkpoint" in capsys.readouterr().out
    recorded = json.loads((run / "config.json").read_text())["config"]
    assert recorded["model"]["name"] == str(first / "models" / "tiny")
    assert recorded["env"]["name"] == str(first / "length_env.py")
    monkeypatch.chdir(second)
    assert main(["train", "--resume", "--run-dir", str(run), "--trainer.steps", "2"]) == 0
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    assert json.loads((run / "config.json").read_text())["config"]["trainer"]["steps"] == 2
