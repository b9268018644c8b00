"""benchmarks/search_qa_report: episodes judged from stored rows, bridge answers caught, paired intervals."""

from __future__ import annotations

import json

import pytest

from benchmarks.eval_stats import bootstrap_mean
from benchmarks.search_qa_report import evaluations, main, paired_change
from looprl.envs.corpus import generate_world

WORLD = generate_world(0)
TITLES = {d.id: d.title for d in WORLD.documents}
TWO_HOP = [q for q in WORLD.questions if q.split == "eval" and q.hops == 2][:3]


def _row(q, reply: str, gold_read: float = 1.0) -> dict:
    correct = f"<answer>{q.answer}</answer>" == reply
    task = {"id": q.id, "answer": q.answer, "info": {"gold_doc_ids": list(q.gold_doc_ids),
            "hops": q.hops, "kind": q.kind}}  # fmt: skip
    return {
        "task": task,
        "messages": [
            {"role": "user", "content": q.question},
            {"role": "assistant", "content": reply},
        ],
        "rewards": {"exact_match": float(correct), "gold_read": gold_read, "searches": 1.0},
    }


def _run(tmp_path, evals: dict[int, list[dict]]) -> None:
    config = {"config": {"env": {"name": "search_qa", "kwargs": {"hops": 2}}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    metrics = [{"step": s, "reward/exact_match": 0.1 * s} for s in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    for step, rows in evals.items():
        d = tmp_path / "eval" / f"step_{step:06d}"
        d.mkdir(parents=True)
        (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_bridge_answers_no_answers_and_the_paired_change(tmp_path, capsys):
    a, b, c = TWO_HOP
    bridge = TITLES[a.gold_doc_ids[1]]
    before = [_row(a, f"<answer>{bridge}</answer>", 0.5), _row(a, "I do not know"),
              _row(b, f"<answer>{b.answer}</answer>"), _row(b, "<answer>x</answer>"),
              _row(c, "<answer>x</answer>"), _row(c, "<answer>x</answer>")]  # fmt: skip
    after = [_row(q, f"<answer>{q.answer}</answer>") for q in (a, a, b, b, c)] + [_row(c, "no")]
    _run(tmp_path, {0: before, 5: after})
    evals = evaluations(tmp_path)
    first = evals[0]
    assert [e["bridge"] for e in first] == [True, False, False, False, False, False]
    assert [e["no_answer"] for e in first] == [False, True, False, False, False, False]
    assert [e["all_gold_read"] for e in first][:2] == [False, True]
    # per question: before 0, 0.5, 0 -> after 1, 1, 0.5: every change is +0.5 or +1
    gain, low, high = paired_change(evals[0], evals[5])
    assert gain == pytest.approx((1 + 0.5 + 0.5) / 3) and 0.5 <= low <= gain <= high <= 1.0
    # read as the rubric reads: an answer written only in reasoning is no answer
    thought = [_row(a, f"<think><answer>{bridge}</answer></think>I am not sure")]
    (tmp_path / "think").mkdir()
    _run(tmp_path / "think", {0: thought})
    judged = evaluations(tmp_path / "think")[0]
    assert [(e["bridge"], e["no_answer"]) for e in judged] == [(False, True)]
    main([str(tmp_path), "--plot", str(tmp_path / "s.png")])
    out = capsys.readouterr().out
    assert "| 0 | 3 x 2 | 0.167 [" in out and "| 5 | 3 x 2 | 0.833 [" in out
    assert "step 0 -> 5 (paired, same questions): +0.667" in out
    assert (tmp_path / "s.png").stat().st_size > 0
    assert set(json.loads((tmp_path / "search_qa_report.json").read_text())) == {"0", "5"}


def test_bootstrap_mean_brackets_the_mean_and_refuses_nothing():
    mean, low, high = bootstrap_mean([0.0, 1.0] * 20)
    assert mean == 0.5 and low < 0.5 < high and high - low < 0.4
    assert bootstrap_mean([0.25] * 5) == (0.25, 0.25, 0.25)
    with pytest.raises(ValueError, match="at least one value"):
        bootstrap_mean([])
