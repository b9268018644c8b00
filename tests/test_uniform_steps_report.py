"""benchmarks/uniform_steps.py: one row per finished run, read from its config and metrics."""

from __future__ import annotations

import json

import pytest

from benchmarks.uniform_steps import main


def test_the_report_counts_no_gradient_steps_and_reads_the_answer_format(tmp_path, capsys):
    run = tmp_path / "sweep" / "rloo-u4-a0-s1"
    (run / "final").mkdir(parents=True)
    config = {"algorithm": {"preset": "rloo"}, "trainer": {"seed": 1, "skip_uniform_steps": True}}
    (run / "config.json").write_text(json.dumps({"config": config}))
    rows = [{"step": 0, "eval/reward": 0.5, "eval/correct_answer": 0.5, "eval/answer_format": 1.0}]
    for step, (flat, fmt) in enumerate([(1.0, 0.9), (0.5, 0.7), (1.0, 0.2)], start=1):
        rows.append({"step": step, "reward/mean": 0.1, "train/zero_var_frac": flat,
                     "train/uniform_steps_skipped": float(flat == 1.0),
                     "reward/answer_format": fmt})  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    main([str(tmp_path / "sweep")])
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "| rloo | true | 1 | 2 of 3 | 2 | 0.500 | 1.00 | 0.60 (0.20) |"
    with pytest.raises(SystemExit, match="no finished run under"):
        main([str(tmp_path / "elsewhere")])
