"""Mistakes that used to end in a traceback or do harm: one line `error: what — fix`, exit 2,
nothing lost. A training run given as a model, an environment module that fails to import or
returns the wrong thing, `looprl sft --output` over something that exists, `| head`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from looprl.cli.main import main
from looprl.models.loading import resolve_model_path


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    """Run `looprl ARGV` in-process: exit 2, one `error: ... — ...` line holding every needle."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and " — " in lines[0], err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes: what a refused command must leave unchanged."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in an empty directory, so a stray `runs/` would show."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A finished training run's directory: metrics, a run config, a checkpoint and final/."""
    run = tmp_path / "runs" / "demo" / "grpo"
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "config.json").write_text(json.dumps({"config": {"model": {"name": "tiny"}}}))
    shutil.copytree(resolve_model_path("tiny"), run / "final")
    return run


@pytest.mark.parametrize("command", [["eval", "calculator", "--model"], ["train", "--model.name"]])
def test_a_training_run_given_as_a_model_points_at_its_final(capsys, in_tmp, run_dir, command):
    before = _snapshot(in_tmp)
    _one_line(
        capsys, [*command, str(run_dir)], "is a training run, not a model", f"use {run_dir}/final"
    )
    checkpoint = run_dir / "checkpoints" / "step_000002"
    _one_line(capsys, [*command, str(checkpoint)], f"a checkpoint of the training run {run_dir}")
    assert _snapshot(in_tmp) == before  # no eval directory, no run written


def test_a_whole_model_loads_wherever_it_lies_even_in_a_runs_checkpoints(tmp_path):
    model = tmp_path / "checkpoints" / "mine"
    shutil.copytree(resolve_model_path("tiny"), model)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')  # the folder above looks like a run
    assert resolve_model_path(str(model)) == model


def test_a_folder_without_weights_or_tokenizer_is_refused_before_loading(capsys, in_tmp):
    folder = in_tmp / "half"
    folder.mkdir()
    shutil.copy(resolve_model_path("tiny") / "config.json", folder)  # config.json alone
    line = _one_line(capsys, ["eval", "calculator", "-m", str(folder)], "not a Hugging Face model")
    assert "missing: weights" in line and "tokenizer" in line and "save_pretrained" in line
    assert sorted(p.name for p in in_tmp.iterdir()) == ["half"]


BAD_ENVS = {
    "syntax.py": ("def load_environment(:\n    pass\n", ["syntax.py:1", "SyntaxError", "fix the"]),
    "missing.py": ("import looprl_no_such_pkg\n", ["imports 'looprl_no_such_pkg'", "install"]),
    "raises.py": ("X = 1 / 0\n", ["ZeroDivisionError", "raises.py:1", "LOOPRL_DEBUG=1"]),
    "wrong.py": (
        "def load_environment(**kwargs):\n    return {'tasks': []}\n",
        ["returned dict, not a looprl Environment", "looprl.ToolEnv"],
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_ENVS))
def test_an_environment_module_that_fails_names_the_file_and_the_problem(capsys, in_tmp, name):
    source, needles = BAD_ENVS[name]
    env = in_tmp / "envs" / name
    env.parent.mkdir()
    env.write_text(source)
    _one_line(capsys, ["eval", str(env), "-m", "tiny", "-n", "1"], name, *needles)
    _one_line(capsys, ["train", "--env.name", str(env)], "env.name", *needles)
    assert sorted(p.name for p in in_tmp.iterdir()) == ["envs"]  # no run, no eval directory


def test_a_module_that_imports_a_missing_package_is_not_an_unknown_environment(
    capsys, in_tmp, monkeypatch
):
    (in_tmp / "my_envs").mkdir()
    (in_tmp / "my_envs" / "__init__.py").write_text("")
    (in_tmp / "my_envs" / "shop.py").write_text("import looprl_no_such_pkg\n")
    monkeypatch.syspath_prepend(str(in_tmp))
    line = _one_line(capsys, ["eval", "my_envs.shop"], "environment my_envs.shop failed to import")
    assert "unknown environment" not in line and "'looprl_no_such_pkg'" in line
    _one_line(capsys, ["eval", "my_envs.nosuch"], "unknown environment 'my_envs.nosuch'")


@pytest.mark.parametrize("argv", [["config", "show"], ["config", "show", "--markdown"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path, argv):
    """`looprl config show | head`: the pipe's reader is gone before the command writes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "looprl", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves at once: every write of the command meets EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert err == ""  # no BrokenPipeError, no "Exception ignored" at exit


def _sft_data(path: Path) -> Path:
    """Four one-turn conversations in `looprl sft`'s format."""
    rows = [
        {"messages": [{"role": "user", "content": f"{i} + 1?"},
                      {"role": "assistant", "content": f"The answer is {i + 1}."}]}
        for i in range(4)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_refuses_an_existing_output_unless_overwrite_and_a_non_model_even_then(
    capsys, tmp_path
):
    data = _sft_data(tmp_path / "d.jsonl")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    before = _snapshot(tmp_path)
    sft = ["sft", "--data", str(data), "-m", "tiny", "--output"]
    _one_line(capsys, [*sft, str(kept)], f"--output {kept} already exists", "--overwrite")
    _one_line(capsys, [*sft, str(kept), "--overwrite"], "is not a model directory")
    _one_line(capsys, [*sft, str(data), "--overwrite"], "is not a model directory")  # a file
    assert _snapshot(tmp_path) == before


@pytest.mark.slow
def test_sft_overwrite_swaps_the_model_in_and_leaves_no_leftovers(capsys, tmp_path):
    data = _sft_data(tmp_path / "d.jsonl")
    out = tmp_path / "model"
    shutil.copytree(resolve_model_path("tiny"), out)
    (out / "old-marker").write_text("the model that was there")
    sft = ["sft", "--data", str(data), "-m", "tiny", "--batch-size", "4", "--output", str(out)]
    assert main([*sft, "--overwrite"]) == 0, capsys.readouterr().err
    assert not (out / "old-marker").exists() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "model"]  # no .old-*, .tmp-*
    assert resolve_model_path(str(out)) == out  # the new model, whole: config, weights, tokenizer
