"""The training console: step lines that fit 120 columns, a short config summary, no third-party noise."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text

from looprl.trainer.config import load_config
from looprl.trainer.logger import (
    LINE_WIDTH,
    MetricsLogger,
    config_summary,
    format_eval_line,
    format_line,
)

# A calculator-like row: four reward functions with long names and every console metric.
ROW = {
    "step": 12,
    "wall_time": 84.2,
    "reward/mean": 0.41234,
    "reward/std": 0.31,
    "reward/correct_answer": 0.31,
    "reward/answer_format": 0.99,
    "reward/used_tool": 0.95,
    "reward/tool_call_validity": 1.0,
    "loss/total": 0.0123,
    "policy/kl": 0.0012,
    "policy/entropy": 0.812,
    "policy/clip_frac": 0.01,
    "train/zero_var_frac": 0.25,
    "train/grad_norm": 0.41,
    "train/lr": 1e-4,
    "rollout/tokens_per_s": 2219.0,
    "time/generate": 2.5,
    "time/train": 4.2,
    "eval/reward": 0.4,
    "eval/correct_answer": 0.31,
    "eval/answer_format": 0.99,
    "eval/used_tool": 0.95,
    "eval/tool_call_validity": 1.0,
    "eval/pass@1": 0.31,
    "eval/turns": 2.07,
    "eval/gen_tokens": 44.0,
}


def plain(markup: str) -> str:
    """The text a terminal shows for a Rich markup string."""
    return Text.from_markup(markup).plain


def test_step_line_fits_and_shows_progress() -> None:
    line = plain(format_line(12, ROW, total=30, eta_s=127.0))
    assert len(line) <= LINE_WIDTH, line
    assert line.startswith("step 12/30 │ reward 0.412 ± 0.310 ")
    # elapsed (the row's wall_time) and the ETA close the line
    assert line.endswith("1m24s, ETA 2m07s"), line
    # the reward functions come first among the optional parts: the first ones fit
    assert "correct_answer=0.31 answer_format=0.99" in line


def test_step_line_drops_what_does_not_fit_in_order() -> None:
    """A narrower budget keeps the always-shown parts and drops the least wanted first."""
    wide = plain(format_line(3, ROW, total=30, eta_s=5.0, width=400))
    assert "lr 1.0e-04" in wide and "gen 2.5s train 4.2s" in wide  # everything fits in 400
    narrow = plain(format_line(3, ROW, total=30, eta_s=5.0, width=60))
    assert narrow == "step  3/30 │ reward 0.412 ± 0.310 │ 1m24s, ETA 5s"
    for width in range(40, 200, 7):
        assert len(plain(format_line(3, ROW, total=30, eta_s=5.0, width=width))) <= max(
            width, len(narrow)
        )


def test_step_line_leaves_absent_metrics_out() -> None:
    assert plain(format_line(1, {"step": 1})) == "step 1"
    line = plain(format_line(2, {"step": 2, "wall_time": 3725.0, "policy/kl": 0.5}, total=9))
    assert line == "step 2/9 │ kl 5.00e-01 │ 1h02m"


def test_eval_line_fits() -> None:
    line = plain(format_eval_line(12, ROW) or "")
    assert line.startswith("  eval at step 12: reward=0.4 correct_answer=0.31")
    assert len(line) <= LINE_WIDTH
    assert format_eval_line(12, {"step": 12, "loss/total": 1.0}) is None


def test_logger_prints_step_of_total_and_eta(tmp_path: Path) -> None:
    buf = io.StringIO()
    con = Console(file=buf, width=300, color_system=None)
    with MetricsLogger(tmp_path, tensorboard=False, console=con, total_steps=4) as log:
        log.log(0, {"eval/reward": 0.1, "time/eval": 0.5})  # the evaluation before training
        log.log(1, {"reward/mean": 0.25, "reward/std": 0.5})
        log.log(2, {"reward/mean": 0.5, "eval/reward": 0.75})
    lines = buf.getvalue().splitlines()
    assert lines[0] == "  eval at step 0: reward=0.1"  # no step line for an evaluation alone
    assert lines[1].startswith("step 1/4 │ reward 0.250 ± 0.500 │ ") and ", ETA " in lines[1]
    assert lines[2].startswith("step 2/4 │ reward 0.500 │ ") and ", ETA " in lines[2]
    assert lines[3] == "  eval at step 2: reward=0.75"
    assert len(lines) == 4


def test_logger_lines_fit_a_narrow_terminal(tmp_path: Path) -> None:
    buf = io.StringIO()
    con = Console(file=buf, width=70, color_system=None)
    with MetricsLogger(tmp_path, tensorboard=False, console=con, total_steps=30) as log:
        log.log(12, {k: v for k, v in ROW.items() if k not in ("step", "wall_time")})
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and all(len(line) <= 70 for line in lines), lines
    assert lines[0].startswith("step 12/30 │ reward 0.412 ± 0.310 ")


def test_config_summary_is_a_few_short_lines() -> None:
    recipe = Path(__file__).parents[1] / "looprl" / "recipes" / "calculator_tiny.toml"
    cfg = load_config(recipe, {"algorithm.overrides": {"eps_high": 0.28}})
    text = plain(
        config_summary(
            cfg, algorithm="grpo", env="calculator", run_dir=Path("runs/demo/grpo"), device="cpu"
        )
    )
    lines = text.splitlines()
    assert len(lines) == 3 and all(len(line) <= LINE_WIDTH for line in lines), text
    assert lines[0].startswith("looprl train calculator · tiny · grpo (eps_high=0.28) → runs/demo")
    assert "config.json" in lines[0]
    assert lines[1].startswith("  30 steps × 16 tasks × 8 rollouts · lr 1.0e-04")
    assert lines[2].startswith("  engine torch on cpu · full weights · eval every 10 steps")


class _Records(logging.Handler):
    """Collects the messages logged to the logger it is attached to."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_loaded_tokenizer_does_not_warn_about_long_sequences() -> None:
    """The renderer encodes whole conversations; the context limit is the environment's.

    Read from transformers' logger, not stderr: its handler keeps whichever stream was stderr
    when an earlier test configured it, so what stderr capture sees depends on test order.
    """
    from transformers import AutoTokenizer

    from looprl.models.loading import load_model, resolve_model_path

    text = "What is 12 * 34? " * 600  # well past the tiny model's 2048 positions
    records, hf_logger = _Records(), logging.getLogger("transformers")
    hf_logger.addHandler(records)
    level = hf_logger.level
    hf_logger.setLevel(logging.WARNING)  # transformers' default, whatever earlier tests set
    try:
        raw = AutoTokenizer.from_pretrained(resolve_model_path("tiny"), local_files_only=True)
        raw.encode(text)
        assert any("sequence length is longer" in m for m in records.messages)  # it does warn
        records.messages.clear()
        _, tokenizer = load_model("tiny", device="cpu")
        assert len(tokenizer.encode(text)) > 2048
        assert not [m for m in records.messages if "sequence length" in m]
    finally:
        hf_logger.removeHandler(records)
        hf_logger.setLevel(level)


@pytest.mark.slow
def test_short_run_prints_no_progress_bars_or_warnings(
    tmp_path: Path, capfd: pytest.CaptureFixture, recwarn: pytest.WarningsRecorder
) -> None:
    """A real two-step LoRA run of the tiny model: our lines only, no tqdm bars from transformers,
    no deprecation transformers addresses to peft."""
    from transformers.utils import logging as hf_logging

    from looprl.trainer.trainer import Trainer

    hf_logging.enable_progress_bar()  # as in a fresh process: loading must turn them off
    cfg = load_config(
        None,
        {
            "model.name": "tiny",
            "model.lora": True,
            "env.name": "calculator",
            "rollout.tasks_per_step": 2,
            "rollout.rollouts_per_task": 2,
            "rollout.max_tokens": 16,
            "trainer.steps": 2,
            "trainer.eval_every": 2,
            "trainer.eval_tasks": 2,
            "run.output_dir": str(tmp_path),
            "run.name": "quiet",
            "run.tensorboard": False,
        },
    )
    Trainer(cfg).run()
    captured = capfd.readouterr()
    out = captured.out + captured.err
    for noise in ("it/s", "%|", "█", "Loading weights", "Writing model", "sequence length"):
        assert noise not in out, (noise, out)
    lines = out.splitlines()
    assert lines[0].startswith("looprl train calculator · tiny · grpo → ")
    steps = [line for line in lines if line.startswith("step ")]
    assert [s[:8] for s in steps] == ["step 1/2", "step 2/2"]
    assert all(len(line) <= LINE_WIDTH for line in steps)
    assert "ETA" in steps[0]
    assert not [w for w in recwarn if "is_gradient_checkpointing" in str(w.message)]
