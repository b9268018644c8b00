"""What a wordle run's held-out games show at each evaluation: wins with an error bar, and how games are lost.

Reads `RUN_DIR/eval/step_*/results.jsonl` (the trainer's evaluations, the same games each time)
and replays every game's messages against the environment's rules: win rate with a 95% Wilson
interval, guesses per win, and the failure modes (replies without a valid guess, guesses that
contradict earlier feedback, a word guessed twice, guesses outside the words the hint listed).
The change from the first evaluation to the last is paired per game (the same secret words), with
a bootstrap 95% interval.

    .venv/bin/python -m benchmarks.wordle_report runs/wordle/rl-s0 [--plot F.png --also RUN ...]
"""

from __future__ import annotations

import argparse
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
    wilson,
)
from looprl.envs.wordle import (
    MAX_GUESSES,
    consistent,
    judge,
    listed_words,
    parse_guess,
    word_lists,
)


def replay(messages: list[dict[str, Any]], target: str) -> dict[str, Any]:
    """One game's outcome and faults, from its messages."""
    _, valid = word_lists()
    history: list[tuple[str, str]] = []
    listed: list[str] | None = None
    faults = {"invalid": 0, "contradicts": 0, "repeat": 0, "off_list": 0}
    won_at = None
    for m in messages:
        if m["role"] == "user":
            listed = listed_words(m["content"]) or listed
            continue
        if (
            m["role"] != "assistant"
            or won_at is not None
            or len(history) + faults["invalid"] >= MAX_GUESSES
        ):
            continue
        marks, _ = judge(m["content"], target, valid)
        guess = parse_guess(m["content"])
        if marks is None or guess is None:
            faults["invalid"] += 1
            continue
        faults["repeat"] += guess in {g for g, _ in history}
        faults["contradicts"] += bool(history) and not consistent((guess,), history)
        faults["off_list"] += listed is not None and guess not in listed
        history.append((guess, marks))
        if marks == "GGGGG":
            won_at = len(history) + faults["invalid"]
    return {"target": target, "won": won_at is not None, "guesses": won_at, **faults}


def evaluations(run_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Every evaluation of the run: step -> replayed games, in a fixed order of secret words."""
    return {
        step: sorted(
            (replay(r["messages"], r["task"]["answer"]) for r in rows), key=lambda g: g["target"]
        )
        for step, rows in stored_evals(run_dir).items()
    }


def paired_gain(
    before: list[dict[str, Any]], after: list[dict[str, Any]], draws: int = 2000
) -> tuple[float, float, float]:
    """Win-rate change over the same games and its bootstrap 95% interval."""
    by_word = {g["target"]: g["won"] for g in before}
    diffs = [float(g["won"]) - float(by_word[g["target"]]) for g in after if g["target"] in by_word]
    return bootstrap_mean(diffs, draws)


def table(evals: dict[int, list[dict[str, Any]]]) -> str:
    """The markdown table: one row per evaluation."""
    lines = [
        "| step | games | win rate [95% CI] | guesses per win | invalid replies / game | contradicting guesses / game | repeats / game | guesses off the hint list / game |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for step, games in evals.items():
        n, wins = len(games), sum(g["won"] for g in games)
        low, high = wilson(wins, n)
        per_win = [g["guesses"] for g in games if g["won"]]
        gpw = f"{statistics.fmean(per_win):.2f}" if per_win else "-"
        rate = {
            k: sum(g[k] for g in games) / n
            for k in ("invalid", "contradicts", "repeat", "off_list")
        }
        lines.append(
            f"| {step} | {n} | {wins / n:.3f} [{low:.3f}, {high:.3f}] | {gpw} | {rate['invalid']:.2f} "
            f"| {rate['contradicts']:.2f} | {rate['repeat']:.2f} | {rate['off_list']:.2f} |"
        )
    return "\n".join(lines)


def plot(runs: dict[str, Path], out: Path) -> Path:
    """Held-out win rate (95% interval) at each evaluation and the training win rate per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (label, run_dir) in enumerate(runs.items()):
        colour = f"C{i}"
        evals = evaluations(run_dir)
        steps = list(evals)
        rates = [sum(g["won"] for g in games) / len(games) for games in evals.values()]
        bounds = [wilson(sum(g["won"] for g in games), len(games)) for games in evals.values()]
        errors = [[r - lo for r, (lo, _) in zip(rates, bounds, strict=True)],
                  [hi - r for r, (_, hi) in zip(rates, bounds, strict=True)]]  # fmt: skip
        ax.errorbar(steps, rates, yerr=errors, color=colour, marker="o", capsize=4,
                    label=f"{label}: held-out (95% CI)")  # fmt: skip
        train = training_curve(run_dir, "reward/win")
        ax.plot(*zip(*train, strict=True), color=colour, alpha=0.4, linestyle="--",
                label=f"{label}: training games")  # fmt: skip
    return finish_plot(fig, ax, out, ylabel="win rate", title="wordle win rate")


def main(argv: list[str] | None = None) -> None:
    """Print the table and the paired first-to-last change; write wordle_report.json in the run."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--plot", type=Path, help="also plot these runs' win rates to this PNG")
    p.add_argument("--also", nargs="*", type=Path, default=[], help="more runs for the plot")
    p.add_argument("--labels", nargs="*", default=[], help="the plot's names of the runs, in order")
    args = p.parse_args(argv)
    evals = evaluations(args.run_dir)
    first, last = min(evals), max(evals)
    print(table(evals))
    if last != first:
        change = paired_gain(evals[first], evals[last])
        print_paired_change("win rate", first, last, change, "same games")
    if args.plot:
        dirs = [args.run_dir, *args.also]
        names = args.labels + [d.name for d in dirs[len(args.labels) :]]
        print(f"plot: {plot(dict(zip(names, dirs, strict=True)), args.plot)}")
    out = args.run_dir / "wordle_report.json"
    out.write_text(json.dumps({str(s): g for s, g in evals.items()}, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
