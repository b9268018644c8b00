"""What a search_qa run's held-out questions show at each evaluation: accuracy with an error bar, and how answers go wrong.

Reads `RUN_DIR/eval/step_*/results.jsonl` (the trainer's evaluations: the same questions each
time, `trainer.eval_rollouts` samples each). A question's score is the mean exact match of its
samples; intervals are bootstrap 95% intervals over questions (samples of one question are not
independent evidence). Failure modes per episode: no `<answer>` at all, the gold pages not all
read, and, on two-hop questions, answering with the bridge entity (the first hop's link, e.g.
the birth city when the question asks for its country). The change from the first evaluation to
the last is paired per question.

    .venv/bin/python -m benchmarks.search_qa_report runs/searchqa/rl-2hop-s0 [--plot F.png]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.eval_stats import (
    bootstrap_mean,
    finish_plot,
    print_paired_change,
    stored_evals,
    training_curve,
)
from looprl.envs.corpus import generate_world
from looprl.envs.search_qa import extract_answer, load_corpus, normalize_answer
from looprl.kit import answer_text
from looprl.types import Message


def titles_of(run_dir: Path) -> dict[str, str]:
    """Page id -> title of the corpus the run used (its config's corpus_path or world_seed)."""
    config = json.loads((run_dir / "config.json").read_text("utf-8"))["config"]
    kwargs = config["env"].get("kwargs") or {}
    if kwargs.get("corpus_path"):
        docs = load_corpus(kwargs["corpus_path"])
    else:
        docs = generate_world(int(kwargs.get("world_seed", 0))).documents
    return {d.id: d.title for d in docs}


def judge(row: dict[str, Any], titles: dict[str, str]) -> dict[str, Any]:
    """One episode's outcome: correct, answered at all, gold pages read, answered the bridge."""
    task = row["task"]
    replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    # read as the rubric reads it: the last reply's text outside reasoning blocks
    answer = extract_answer(answer_text(Message("assistant", replies[-1]))) if replies else None
    gold = task["info"].get("gold_doc_ids") or []
    bridge = titles.get(gold[1]) if len(gold) > 1 else None
    return {
        "id": task["id"],
        "kind": task["info"].get("kind", ""),
        "hops": task["info"].get("hops", 1),
        "correct": float(row["rewards"].get("exact_match", 0.0)),
        "no_answer": answer is None,
        "all_gold_read": row["rewards"].get("gold_read", 0.0) >= 1.0,
        "bridge": bridge is not None
        and answer is not None
        and normalize_answer(answer) == normalize_answer(bridge),
        "searches": row["rewards"].get("searches", 0.0),
    }


def per_question(episodes: list[dict[str, Any]]) -> dict[str, float]:
    """Question id -> mean exact match over its samples."""
    scores: dict[str, list[float]] = collections.defaultdict(list)
    for e in episodes:
        scores[e["id"]].append(e["correct"])
    return {q: statistics.fmean(s) for q, s in scores.items()}


def evaluations(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Every evaluation of the run: step -> judged episodes."""
    titles = titles_of(run_dir)
    return {step: [judge(r, titles) for r in rows] for step, rows in stored_evals(run_dir).items()}


def table(evals: dict[int, list[dict[str, Any]]]) -> str:
    """The markdown table: one row per evaluation, accuracy overall and per question kind."""
    kinds = sorted({e["kind"] for eps in evals.values() for e in eps})
    head = " | ".join(kinds)
    lines = [
        f"| step | questions x samples | accuracy [95% CI] | {head} | all gold pages read | answered the bridge | no answer | searches / episode |",
        "|---|---|---|" + "---|" * len(kinds) + "---|---|---|---|",
    ]  # fmt: skip
    for step, eps in evals.items():
        mean, low, high = bootstrap_mean(list(per_question(eps).values()))
        by_kind = []
        for kind in kinds:
            scores = [e["correct"] for e in eps if e["kind"] == kind]
            by_kind.append(f"{statistics.fmean(scores):.2f}" if scores else "-")
        n = len(eps)
        questions = len({e["id"] for e in eps})
        rate = {k: sum(e[k] for e in eps) / n for k in ("all_gold_read", "bridge", "no_answer")}
        lines.append(
            f"| {step} | {questions} x {n // questions} | {mean:.3f} [{low:.3f}, {high:.3f}] | "
            + " | ".join(by_kind)
            + f" | {rate['all_gold_read']:.2f} | {rate['bridge']:.2f} | {rate['no_answer']:.2f} "
            f"| {statistics.fmean(e['searches'] for e in eps):.2f} |"
        )
    return "\n".join(lines)


def paired_change(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> tuple[float, float, float]:
    """Accuracy change over the same questions (each its samples' mean) and its 95% interval."""
    first, last = per_question(before), per_question(after)
    return bootstrap_mean([last[q] - first[q] for q in last if q in first])


def plot(run_dir: Path, evals: dict[int, list[dict[str, Any]]], out: Path) -> Path:
    """Held-out accuracy (95% interval) at each evaluation and the training reward per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    steps = list(evals)
    stats = [bootstrap_mean(list(per_question(eps).values())) for eps in evals.values()]
    errors = [[m - lo for m, lo, _ in stats], [hi - m for m, _, hi in stats]]
    ax.errorbar(steps, [m for m, _, _ in stats], yerr=errors, marker="o", capsize=4,
                label="held-out questions (95% CI over questions)")  # fmt: skip
    train = training_curve(run_dir, "reward/exact_match")
    if train:
        ax.plot(*zip(*train, strict=True), alpha=0.4, linestyle="--", label="training episodes")
    first = next(iter(evals.values()))
    title = f"search_qa accuracy ({len({e['id'] for e in first})} held-out questions)"
    return finish_plot(fig, ax, out, ylabel="exact match", title=title)


def main(argv: list[str] | None = None) -> None:
    """Print the table and the paired first-to-last change; write search_qa_report.json in the run."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--plot", type=Path, help="also plot held-out and training accuracy to this PNG")
    args = p.parse_args(argv)
    evals = evaluations(args.run_dir)
    first, last = min(evals), max(evals)
    print(table(evals))
    if last != first:
        change = paired_change(evals[first], evals[last])
        print_paired_change("accuracy", first, last, change, "same questions")
    if args.plot:
        print(f"plot: {plot(args.run_dir, evals, args.plot)}")
    out = args.run_dir / "search_qa_report.json"
    out.write_text(json.dumps({str(s): e for s, e in evals.items()}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
