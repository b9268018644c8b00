"""`looprl bootstrap`: one-line refusals before any work, the train command, and the tiny model end to end."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from looprl.cli.bootstrap import train_command
from looprl.cli.main import main
from looprl.models.loading import resolve_model_path


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--bootstrap.attemps", "3"], "did you mean --bootstrap.attempts?"),
        (
            ["--bootstrap.attempts", "0"],
            "bootstrap.attempts: Input should be greater than or equal to 1",
        ),
        (
            ["--engine.kind", "vllm", "--engine.base_urls", "http://127.0.0.1:9/v1"],
            "engine.base_urls: servers you started serve fixed weights",
        ),
        (
            [
                "--bootstrap.teacher_base_url",
                "http://127.0.0.1:9/v1",
                "--bootstrap.teacher_model",
                "m",
            ],
            "no server answers at http://127.0.0.1:9/v1",
        ),
        (
            ["--bootstrap.teacher_model", "m"],
            "teacher_base_url and bootstrap.teacher_model go together",
        ),
    ],
)
def test_a_bad_config_is_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], expected: str
) -> None:
    out = tmp_path / "boot"
    assert main(["bootstrap", "calculator", "--output", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err and err.count("\n") == 1
    assert not out.exists()


def test_resume_needs_the_bootstrap_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bootstrap", "calculator", "--resume", "--output", str(tmp_path)]) == 2
    assert "holds no bootstrap" in capsys.readouterr().err


def test_the_train_command_keeps_the_config_and_drops_bootstrap_fields() -> None:
    args = argparse.Namespace(config="c.toml", env="calculator")
    dotted = ["--env.kwargs.digits", "1", "--bootstrap.attempts=8", "--model.name", "tiny",
              "--optim.lr=1e-4"]  # fmt: skip
    assert train_command(args, dotted, "runs/b/round_2/model") == [
        "looprl", "train", "c.toml", "--env.name", "calculator", "--env.kwargs.digits", "1",
        "--optim.lr=1e-4", "--model.name", "runs/b/round_2/model",
    ]  # fmt: skip


def test_a_resume_hands_over_with_the_config_the_bootstrap_started_with(tmp_path: Path) -> None:
    from looprl.cli.bootstrap import with_invocation

    first = argparse.Namespace(config="c.toml", env="python_math", resume=False)
    typed = ["--env.kwargs.hint_style", "call_answer", "--bootstrap.max_rounds", "3"]
    assert with_invocation(first, typed, tmp_path) == (first, typed)
    # resumed with no --config: the recorded TOML and overrides come back, the new ones last
    resumed = argparse.Namespace(config=None, env="python_math", resume=True)
    args, dotted = with_invocation(resumed, ["--bootstrap.max_rounds", "5"], tmp_path)
    assert args.config == "c.toml" and dotted == [*typed, "--bootstrap.max_rounds", "5"]
    assert train_command(args, dotted, "runs/b/round_3/model") == [
        "looprl", "train", "c.toml", "--env.name", "python_math", "--env.kwargs.hint_style",
        "call_answer", "--model.name", "runs/b/round_3/model",
    ]  # fmt: skip
    # resumed with a --config of its own: what was typed stands
    other = argparse.Namespace(config="d.toml", env="python_math", resume=True)
    assert with_invocation(other, [], tmp_path) == (other, [])


@pytest.mark.slow
def test_tiny_model_bootstraps_resumes_and_hands_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # success_threshold 0: every scored attempt is a success, so round 1 fine-tunes the random
    # tiny model for real and round 2 (pass@1 1.0 again) stalls
    out = tmp_path / "boot"
    argv = ["bootstrap", "calculator", "-m", "tiny", "--output", str(out),
            "--env.kwargs.digits", "1", "--env.kwargs.max_tokens_per_turn", "8",
            "--bootstrap.tasks", "3", "--bootstrap.attempts", "2", "--bootstrap.max_rounds", "3",
            "--bootstrap.success_threshold", "0", "--bootstrap.sft_lr", "1e-3"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "bootstrap.jsonl").read_text().splitlines()]
    assert [r["stop"] for r in rows] == [None, "stalled"]
    assert rows[0]["kept"] == rows[0]["attempts"] == 6 and rows[0]["sft_steps"] == 1
    assert rows[1]["sampled_model"] == str(out / "round_1" / "model") and rows[0]["tokens"] > 0
    trained = load_file(out / "round_1" / "model" / "model.safetensors")
    start = load_file(resolve_model_path("tiny") / "model.safetensors")
    assert any(not start[k].equal(trained[k]) for k in start)
    assert "bootstrap rounds" in printed and "signal: expected fraction of GRPO groups" in printed
    assert "model handed over: tiny" in printed
    assert "looprl train --env.name calculator --env.kwargs.digits 1" in printed
    # a finished bootstrap resumed: no round runs again; --then-train runs the printed command
    run_dir = tmp_path / "runs"
    again = [*argv, "--resume", "--then-train", "--trainer.steps", "1",
             "--rollout.tasks_per_step", "1", "--rollout.rollouts_per_task", "2",
             "--trainer.eval_every", "0", "--trainer.eval_tasks", "1",
             "--run.output_dir", str(run_dir), "--run.name", "rl"]  # fmt: skip
    assert main(again) == 0
    assert len((out / "bootstrap.jsonl").read_text().splitlines()) == 2
    assert json.loads((run_dir / "rl" / "summary.json").read_text())["status"] == "finished"


def test_a_round_without_success_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    from looprl.cli.bootstrap import print_report
    from looprl.sft.bootstrap import BootstrapOutcome, RoundRecord
    from looprl.sft.successes import round_stats
    from looprl.trainer.config import load_config

    stats = round_stats({"a": (16, 0), "b": (16, 0)}, group_size=4)
    record = RoundRecord(
        round=1, by="model", sampler="tiny", sampled_model="tiny", stats=stats, kept=0,
        kept_total=0, sft_steps=0, model=None, tokens=900, seconds=3.0, sample_seconds=3.0,
        sft_seconds=0.0, stop="no_successes",
    )  # fmt: skip
    print_report(BootstrapOutcome([record], "no_successes", "tiny", 1), load_config(None))
    out = " ".join(capsys.readouterr().out.split())
    assert "round 1 kept no new success (reward >= 1.0): nothing to fine-tune on" in out
    assert "raise bootstrap.attempts or bootstrap.attempt_temperature" in out and "0/32" in out
    assert "rationalise with the environment's hint (bootstrap.rationalize)" in out

    # rationalised already, and the hinted attempts failed too: the fix is a stronger hint
    hinted = dataclasses.replace(record, hinted_attempts=128)
    config = load_config(None, {"bootstrap.rationalize": True})
    print_report(BootstrapOutcome([hinted], "no_successes", "tiny", 1), config)
    out = " ".join(capsys.readouterr().out.split())
    assert "kept no new success (reward >= 1.0), nor any of its 128 hinted attempts" in out
    assert "give a stronger hint" in out and "bootstrap.rationalize)" not in out


def test_the_table_names_each_rounds_k_when_a_probe_cut_one_short(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from looprl.cli.bootstrap import print_report
    from looprl.sft.bootstrap import BootstrapOutcome, RoundRecord
    from looprl.sft.successes import round_stats
    from looprl.trainer.config import load_config

    def record(n: int, counts: dict[str, tuple[int, int]]) -> RoundRecord:
        return RoundRecord(
            round=n, by="model", sampler="tiny", sampled_model="tiny",
            stats=round_stats(counts, group_size=4), kept=0, kept_total=1, sft_steps=1,
            model="m", tokens=9, seconds=1.0, sample_seconds=1.0, sft_seconds=0.0, stop=None,
        )  # fmt: skip

    probe_only = record(1, {"a": (2, 0), "b": (2, 0)})
    whole = dataclasses.replace(record(2, {"a": (8, 4), "b": (8, 0)}), stop="handover")
    print_report(BootstrapOutcome([probe_only, whole], "handover", "m", 2), load_config(None))
    out = " ".join(capsys.readouterr().out.split())
    assert "pass@k" in out and "(k=2)" in out and "(k=8)" in out
    assert "each task's k attempts (fewer in a round whose probe found no success)" in out


def test_ctrl_c_says_how_to_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(job: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("looprl.sft.bootstrap.run_bootstrap", interrupted)
    out = tmp_path / "boot"
    assert main(["bootstrap", "calculator", "--output", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted: the bootstrap stopped; finished rounds")
    assert f"resume with: looprl bootstrap calculator --output {out} --resume" in err
