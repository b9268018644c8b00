"""Tier 1: training configs load from TOML, take overrides, and fail early naming the field."""

from __future__ import annotations

import pytest

from looprl.trainer.config import ConfigError, load_config, parse_cli_overrides


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[algorithm]\npreset = "dapo"\n[optim]\nlr = 0.001\n')
    cfg = load_config(
        path,
        parse_cli_overrides(
            ["--optim.lr", "2e-5", "--trainer.steps=3", "--env.kwargs", '{"max_turns": 2}']
        ),
    )
    assert cfg.algorithm.preset == "dapo" and cfg.optim.lr == 2e-5 and cfg.trainer.steps == 3
    assert cfg.env.kwargs == {"max_turns": 2}


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('[algorithm]\npreset = "grpoo"\n', "unknown preset 'grpoo'"),
        ("[optim]\nlr = -1.0\n", "optim.lr"),
        ("[trainer]\nsteps = 0\n", "trainer.steps"),
        ("[trainer]\nstepz = 3\n", "trainer.stepz"),
        ("[algorithm]\noverrides = {eps_hi = 0.3}\n", "unknown algorithm field"),
        ('[trainer]\nearly_stop_metric = "eval/reward"\n', "early_stop_value"),
        ("[optim\nlr = 1", "not valid TOML"),
    ],
)
def test_bad_config_names_the_field(tmp_path, toml, needle):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=None) as info:
        load_config(path)
    assert needle in str(info.value)


def test_missing_file_and_bad_override():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/x.toml")
    with pytest.raises(ConfigError, match="section.field"):
        parse_cli_overrides(["steps", "3"])


def test_missing_environment_fails_before_loading_a_model():
    from looprl.trainer.trainer import Trainer

    cfg = load_config(None, {"env.name": "no_such_env_xyz", "model.name": "/nonexistent/model"})
    with pytest.raises(ConfigError, match="env.name: unknown environment 'no_such_env_xyz'"):
        Trainer(cfg)


def test_resume_without_a_config_file_continues_with_the_recorded_config(tmp_path):
    """`looprl train --resume --run-dir DIR`: the run's model, LoRA and algorithm, not the defaults."""
    import argparse
    import json

    from looprl.cli.train import train_config

    started = load_config(
        None, {"model.lora": True, "algorithm.preset": "cispo", "trainer.steps": 10}
    )
    (tmp_path / "config.json").write_text(json.dumps({"config": started.model_dump()}))

    def args(config=None, resume=True):
        return argparse.Namespace(
            config=config, resume=resume, run_dir=str(tmp_path), nproc=1, force=False
        )

    cfg, run_dir = train_config(args(), ["--trainer.steps", "20"])
    assert run_dir == tmp_path and cfg.model.lora and cfg.algorithm.preset == "cispo"
    assert cfg.trainer.steps == 20  # an override still applies on top
    fresh, _ = train_config(args(resume=False), [])
    assert not fresh.model.lora  # without --resume the defaults, as before
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(
        ConfigError, match="not a looprl run record.*TOML config the run was started"
    ):
        train_config(args(), [])
    (tmp_path / "config.json").unlink()
    with pytest.raises(ConfigError, match="does not exist.*TOML config the run was started"):
        train_config(args(), [])


@pytest.mark.parametrize(
    ("argv", "toml", "needle"),
    [
        (["--learning_rate", "1e-5"], None, "did you mean --optim.lr? learning_rate is TRL's"),
        (["--num-generations=8"], None, "did you mean --rollout.rollouts_per_task?"),
        (["--optim.learning_rate", "1e-5"], None, "did you mean --optim.lr?"),
        (["--trainer.beta", "0.04"], None, "did you mean --algorithm.overrides.kl_coef?"),
        (["--max_steps", "5"], None, "did you mean --trainer.steps?"),
        (["--temperature", "0.7"], None, "did you mean --rollout.temperature?"),
        (["--trainer.lr", "1e-5"], None, "did you mean --optim.lr?"),
        ([], "per_device_train_batch_size = 8\n", "did you mean rollout.tasks_per_step?"),
        ([], "[trainer]\nmax_completion_length = 256\n", "did you mean rollout.max_tokens?"),
        ([], "[optim]\ngradient_accumulation_steps = 4\n", "trainer.micro_batch_tokens"),
        ([], "num_train_epochs = 1\n", "did you mean trainer.steps?"),
    ],
)
def test_trl_field_names_point_to_ours(capsys, tmp_path, argv, toml, needle):
    """The names people bring from TRL and verifiers get looprl's field, on the CLI and in TOML."""
    from looprl.cli.main import main

    head = []
    if toml is not None:
        (tmp_path / "trl.toml").write_text(toml)
        head = [str(tmp_path / "trl.toml")]
    assert main(["train", *head, "--run-dir", str(tmp_path / "run"), *argv]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and " — " in lines[0], err
    assert needle in lines[0] and "Traceback" not in err
    assert not (tmp_path / "run").exists()
