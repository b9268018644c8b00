"""Held-out accuracy by kind of task: an evaluation's episodes grouped by a pattern in the question.

`looprl eval --output DIR` writes `DIR/results.jsonl`; this groups its episodes by the first
group of `--pattern` found in each task's last prompt message, and prints per kind the episodes,
the share scored at or above `--threshold` (what pass@1 counts) and its 95% Wilson interval.

    python -m benchmarks.eval_by_kind runs/z/eval-rg3-grpo80 --pattern ' ([-+*/]) '
    python -m benchmarks.eval_by_kind runs/z/eval-pm-s1-grpo \\
        --pattern '(cents of change|remainder when|sum of the squares|reduced fraction|team of)'
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from benchmarks.eval_stats import wilson


def by_kind(results: Path, pattern: str, threshold: float = 1.0) -> dict[str, tuple[int, int]]:
    """Kind -> (episodes scored >= threshold, episodes); a question the pattern misses is '?'."""
    regex = re.compile(pattern)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for line in results.read_text().splitlines():
        row = json.loads(line)
        question = row["task"]["prompt"][-1]["content"]
        found = regex.search(question)
        cell = counts[found.group(1) if found else "?"]
        cell[0] += row["reward"] >= threshold
        cell[1] += 1
    return {kind: (wins, n) for kind, (wins, n) in sorted(counts.items())}


def main(argv: list[str] | None = None) -> None:
    """Parse flags and print one line per kind."""
    p = argparse.ArgumentParser(description="held-out accuracy by kind of task")
    p.add_argument("eval_dir", type=Path, help="a `looprl eval --output` directory")
    p.add_argument("--pattern", required=True, help="regex; its first group names the kind")
    p.add_argument("--threshold", type=float, default=1.0, help="reward that counts as solved")
    args = p.parse_args(argv)
    results = args.eval_dir / "results.jsonl"
    if not results.exists():
        raise SystemExit(f"{results} does not exist: give a `looprl eval --output` directory")
    print("kind | episodes | solved | 95% interval")
    for kind, (wins, n) in by_kind(results, args.pattern, args.threshold).items():
        low, high = wilson(wins, n)
        print(f"{kind} | {n} | {wins / n:.3f} | [{low:.3f}, {high:.3f}]")


if __name__ == "__main__":
    main()
