"""benchmarks/compare_algorithms.py: regimes, the report's numbers, and a sweep that is stopped and resumed."""

from __future__ import annotations

import json

import pytest

from benchmarks import compare_algorithms as ca
from benchmarks.compare_report import markdown_table, mean_curves, run_stats
from benchmarks.compare_runs import check_same_config
from looprl.trainer.trainer import Trainer

KEY = "eval/correct_answer"


def test_regimes_vary_one_axis_from_the_baseline_or_the_whole_grid():
    one_axis = ca.regimes([1, 2, 4], [0, 1, 2], grid=False)
    assert [r.label for r in one_axis] == [
        "on-policy", "2 updates/batch", "4 updates/batch", "async k=1", "async k=2",
    ]  # fmt: skip
    grid = ca.regimes([1, 2], [0, 1], grid=True)
    assert [r.tag for r in grid] == ["u1-a0", "u1-a1", "u2-a0", "u2-a1"]
    assert grid[-1].label == "2 updates/batch, async k=1"


def _rows(acc: list[float], entropy: list[float], clip: float = 0.1) -> list[dict]:
    """Step 0 evaluation, then one training row per entropy value; accuracy every other step."""
    rows = [{"step": 0, "wall_time": 1.0, KEY: acc[0]}]
    for i, e in enumerate(entropy, 1):
        row = {"step": i, "wall_time": 10.0 * i, "policy/entropy": e, "policy/clip_frac": clip,
               "policy/clip_frac_low": clip / 4, "policy/clip_frac_high": 3 * clip / 4, "policy/logprob_gap": 0.01 * i}  # fmt: skip
        if i % 2 == 0:
            row[KEY] = acc[i // 2]
        rows.append(row)
    return rows


def test_run_stats_reach_means_and_collapse_flags():
    # accuracy 0.5 -> 0.2 -> 0.6 -> 0.3 at steps 0, 2, 4, 6: target 0.55 first reached at step 4
    # (wall 40 s); it ends 0.3 below its best (> margin 0.1): an accuracy collapse. Entropy 1.0
    # for three steps, then 0.2 for three: 0.2 < 0.25 x 1.0, an entropy collapse too.
    stats = run_stats(_rows([0.5, 0.2, 0.6, 0.3], [1, 1, 1, 0.2, 0.2, 0.2]), KEY, 0.55)
    assert (stats.start, stats.final) == (0.5, 0.3)
    assert (stats.reach_step, stats.reach_seconds) == (4, 40.0)
    assert stats.clip_frac == pytest.approx(0.1) and stats.clip_frac_high == pytest.approx(0.075)
    assert stats.logprob_gap == pytest.approx(0.035)  # mean of 0.01 .. 0.06
    assert stats.collapse == "accuracy+entropy" and stats.seconds == 60.0
    # a run that ends 0.05 below its start with entropy halved: no collapse at the defaults
    calm = run_stats(_rows([0.5, 0.5, 0.5, 0.45], [1, 1, 1, 0.5, 0.5, 0.5]), KEY, 0.9)
    assert calm.collapse == "" and calm.reach_step is None
    # climbs to 0.4 and falls back to 0.05, near its start of 0.1: collapsed from its best
    fell = run_stats(_rows([0.1, 0.4, 0.3, 0.05], [1] * 6), KEY, 0.9)
    assert fell.collapse == "accuracy"
    # starts at 0.08 and solves nothing from the first evaluation on: collapsed, though by < margin
    gone = run_stats(_rows([0.08, 0.0, 0.0, 0.0], [1] * 6), KEY, 0.9)
    assert gone.collapse == "accuracy"
    assert run_stats(_rows([0.0, 0.0, 0.0, 0.0], [1] * 6), KEY, 0.9).collapse == ""  # never above 0


def test_table_and_curves_average_over_seeds():
    a = run_stats(_rows([0.2, 0.4, 0.6, 0.8], [1] * 6), KEY, 0.5)
    b = run_stats(_rows([0.2, 0.2, 0.2, 0.4], [1] * 6), KEY, 0.5)
    table = markdown_table({("grpo", "on-policy"): [a, b]}, 0.5)
    # finals 0.8 and 0.4: mean 0.6, population std 0.2; only the first reached 0.5 (step 4, 40 s)
    assert "| grpo | on-policy | 0.600 ± 0.200 | 4.0 (1/2) | 40 | 0.100 (0.025 / 0.075) |" in table
    assert table.splitlines()[-1].endswith("| 0/2 |")
    series, bands = mean_curves(
        {"grpo": [_rows([0.2, 0.4], [1, 1]), _rows([0.4, 0.6], [1, 1])]}, KEY, "step"
    )
    assert series["grpo"] == [(0.0, pytest.approx(0.3)), (2.0, pytest.approx(0.5))]
    assert bands["grpo"][0] == (0.0, pytest.approx(0.2), pytest.approx(0.4))


def test_bad_flags_are_named(capsys):
    with pytest.raises(SystemExit):
        ca.parse_args(["--presets", "grpo", "nope"])
    with pytest.raises(SystemExit):
        ca.parse_args(["--updates-per-batch", "0"])
    with pytest.raises(SystemExit):
        ca.parse_args(["--also-plot", "entropy"])  # a metric's name of before the namespaces
    assert "--also-plot: 'entropy' is the old name of a metric; write 'policy/entropy'" in (
        capsys.readouterr().err
    )
    args = ca.parse_args(["--optim.lr", "3e-4"])
    assert args.overrides == {"optim.lr": 3e-4}


SMALL = [
    "--init", "tiny", "--presets", "grpo", "--seeds", "0", "--steps", "2", "--eval-every", "1",
    "--eval-tasks", "2", "--tasks-per-step", "2", "--rollouts", "2", "--max-async-steps", "0", "1",
]  # fmt: skip


@pytest.mark.slow
def test_a_stopped_sweep_resumes_where_it_stopped(tmp_path, monkeypatch):
    """First call: the on-policy run finishes, the async one is killed after step 2 was logged but
    before its checkpoint (the last one is step 1). Second call: the first is read back, the
    second continues from step 1. A changed setting is refused, not silently reused."""
    out = ["--out", str(tmp_path)]
    original = Trainer._save_rollouts

    def killed_at_step_2_of_async(self, step, groups):
        original(self, step, groups)
        if step == 2 and self.cfg.trainer.max_async_steps == 1:
            raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(Trainer, "_save_rollouts", killed_at_step_2_of_async)
    with pytest.raises(KeyboardInterrupt):
        ca.main([*SMALL, *out])
    assert (tmp_path / "grpo-u1-a0-s0" / "done.json").exists()
    assert not (tmp_path / "grpo-u1-a1-s0" / "done.json").exists()
    assert not (tmp_path / "grpo-u1-a0-s0" / "checkpoints").exists()  # finished: dropped
    monkeypatch.setattr(Trainer, "_save_rollouts", original)

    ca.main([*SMALL, *out])
    summary = json.loads((tmp_path / "summary.json").read_text())
    by_run = {r["run"]: r for r in summary["runs"]}
    assert by_run["grpo-u1-a0-s0"]["status"] == "reused"
    assert by_run["grpo-u1-a1-s0"]["status"] == "resumed"
    assert by_run["grpo-u1-a1-s0"]["resumed_from"] == [1]
    rows = [
        json.loads(x)
        for x in (tmp_path / "grpo-u1-a1-s0" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 2 logged once: the killed one was dropped
    assert by_run["grpo-u1-a1-s0"]["staleness"] is not None
    assert "| grpo | async k=1 |" in summary["table"] and "| grpo | on-policy |" in summary["table"]
    for plot in ("accuracy-u1-a0-step.png", "accuracy-u1-a1-wall.png"):
        assert (tmp_path / plot).stat().st_size > 0

    cfg = ca.run_config(
        ca.parse_args([*SMALL, *out, "--rollouts", "3"]), "grpo", ca.Regime(1, 0), 0
    )
    with pytest.raises(SystemExit, match="rollout.rollouts_per_task: 2 there, 3 now"):
        check_same_config(cfg, tmp_path / "grpo-u1-a0-s0")


def test_report_only_reads_back_and_starts_nothing(tmp_path):
    """--report-only on a sweep with one finished run: it is reported, the other is listed as
    missing, and no run directory is created or trained."""
    out = ["--out", str(tmp_path)]
    ca.main([*SMALL, *out, "--max-async-steps", "0"])  # the on-policy run only
    ca.main(
        [*SMALL, *out, "--report-only", "--also-plot", "rollout/gen_tokens", "eval/no_such_key"]
    )
    assert (tmp_path / "rollout_gen_tokens-u1-a0-step.png").stat().st_size > 0
    assert not list(tmp_path.glob("eval_no_such_key*"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    by_run = {r["run"]: r["status"] for r in summary["runs"]}
    assert by_run == {"grpo-u1-a0-s0": "reused", "grpo-u1-a1-s0": "missing"}
    assert not (tmp_path / "grpo-u1-a1-s0").exists()
    assert "| grpo | on-policy |" in summary["table"] and "async" not in summary["table"]
    elsewhere = ["--out", str(tmp_path / "not-the-sweep")]
    with pytest.raises(SystemExit, match="no finished run in .*not-the-sweep.*check --out"):
        ca.main([*SMALL, *elsewhere, "--report-only"])
