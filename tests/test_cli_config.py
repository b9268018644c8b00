"""The training config describes itself: `train --help`, `config show` and docs/config.md list every field."""

from __future__ import annotations

from pathlib import Path

import pytest

from looprl.cli.fields import model_fields, show_value
from looprl.cli.main import main
from looprl.cli.train import SFTConfig, config_markdown
from looprl.eval.run import EvalConfig
from looprl.trainer.config import TrainConfig

ROOT = Path(__file__).parent.parent


def _help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    return capsys.readouterr().out


def test_train_help_lists_every_field_with_type_default_and_description(capsys) -> None:
    text = _help(capsys, ["train", "--help"])
    flat = " ".join(text.split())
    fields = model_fields(TrainConfig)
    assert len(fields) > 50
    for f in fields:
        assert f"--{f.key} {f.type} (default {show_value(f.default)})" in text, f.key
        assert " ".join(f.description.split()) in flat, f.key


def test_every_field_of_the_three_configs_has_a_description() -> None:
    for model in (TrainConfig, EvalConfig, SFTConfig):
        assert [f.key for f in model_fields(model) if not f.description] == []


def test_config_show_marks_the_values_of_a_file(capsys, tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[trainer]\nsteps = 3\n[optim]\nschedule = "cosine"\n')
    assert main(["config", "show", str(path), "--optim.lr", "0.002"]) == 0
    out = capsys.readouterr().out
    assert "--trainer.steps int = 3 (default 100)" in out
    assert '--optim.schedule constant|linear|cosine = "cosine" (default "constant")' in out
    assert "--optim.lr float = 0.002 (default 1e-05)" in out
    assert "--trainer.seed int (default 0)" in out  # untouched fields show their default


def test_docs_config_md_is_generated_from_the_models() -> None:
    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert text == config_markdown(), (
        "docs/config.md is out of date: run `looprl config show --markdown > docs/config.md`"
    )
    for f in model_fields(TrainConfig):
        assert f"| `{f.key}` |" in text


def test_sft_and_eval_flags_come_from_their_models(capsys) -> None:
    text = " ".join(_help(capsys, ["sft", "--help"]).split())
    for f in model_fields(SFTConfig):
        assert f"--{f.key.replace('_', '-')}" in text
    assert "writes) (required)" in text and "Undefined" not in text  # --data has no default
    text = " ".join(_help(capsys, ["eval", "--help"]).split())
    for f in model_fields(EvalConfig):
        if f.key not in ("env", "env_kwargs") and not f.key.startswith("engine."):
            assert f"--{f.key.replace('_', '-')}" in text, f.key
