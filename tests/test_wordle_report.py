"""benchmarks/wordle_report: games replayed from stored messages, failure modes counted, intervals sound."""

from __future__ import annotations

import json

import pytest

from benchmarks.eval_stats import wilson
from benchmarks.wordle_report import evaluations, main, paired_gain, replay


def _msgs(*turns: tuple[str, str]) -> list[dict[str, str]]:
    out = [{"role": "user", "content": "Guess the secret word."}]
    for reply, feedback in turns:
        out += [{"role": "assistant", "content": reply}, {"role": "user", "content": feedback}]
    return out


def test_replay_counts_each_fault():
    game = replay(
        _msgs(
            ("<guess>slate</guess>", "SLATE - - - - -\nPossible words: crony, crown (and 3 more)"),
            ("no tag", "No guess found."),
            ("<guess>slate</guess>", "SLATE - - - - -"),  # repeat, and contradicts nothing new
            ("<guess>stare</guess>", "STARE ..."),  # s/t/a/e were ruled out: contradicts; off list
            ("<guess>crown</guess>", "won"),
        ),
        "crown",
    )
    assert game["won"] and game["guesses"] == 5
    assert (game["invalid"], game["repeat"], game["off_list"]) == (1, 1, 2)
    assert game["contradicts"] == 2  # slate again (ruled out by its own feedback) and stare
    lost = replay(_msgs(*[("<guess>slate</guess>", "SLATE - - - - -")] * 7), "crown")
    assert not lost["won"] and lost["guesses"] is None and lost["repeat"] == 5  # six guesses count


def test_wilson_and_paired_gain():
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0
    low, high = wilson(50, 100)
    assert low == pytest.approx(0.404, abs=1e-3) and high == pytest.approx(0.596, abs=1e-3)
    before = [{"target": f"w{i}", "won": i < 3} for i in range(10)]
    after = [{"target": f"w{i}", "won": i < 7} for i in range(10)]
    gain, lo, hi = paired_gain(before, after)
    assert gain == pytest.approx(0.4) and lo <= 0.4 <= hi and lo > 0


def test_report_reads_a_run(tmp_path, capsys):
    for step, reply in ((0, "<guess>slate</guess>"), (10, "<guess>crown</guess>")):
        d = tmp_path / "eval" / f"step_{step:06d}"
        d.mkdir(parents=True)
        row = {"task": {"answer": "crown"}, "messages": _msgs((reply, "feedback"))}
        (d / "results.jsonl").write_text(json.dumps(row) + "\n")
    assert list(evaluations(tmp_path)) == [0, 10]
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/win": 0.5}) + "\n")
    main([str(tmp_path), "--plot", str(tmp_path / "w.png"), "--labels", "one run"])
    assert (tmp_path / "w.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "| 0 | 1 | 0.000" in out and "| 10 | 1 | 1.000" in out and "+1.000" in out
    assert (tmp_path / "wordle_report.json").exists()
    with pytest.raises(SystemExit, match="no eval"):
        evaluations(tmp_path / "missing")
