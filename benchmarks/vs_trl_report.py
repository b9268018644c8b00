"""The figures of benchmarks/vs_trl.py: per-run medians, pairwise ratios and the printed tables."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

SIDES = ("looprl", "trl")
"""The two frameworks, in the order the table lists them."""


def per_run(run: dict[str, Any], target: float) -> dict[str, float | None]:
    """One run's figures: medians over the steps after the first, peak memory, time-to-target."""
    steps = run["steps"][1:] if len(run["steps"]) > 1 else run["steps"]
    med = statistics.median
    reach = None
    for step in sorted(run["accuracy"]):
        if run["accuracy"][step] >= target:
            reach = sum(s["step_s"] for s in run["steps"][:step])
            break
    return {
        "s_step": med(s["step_s"] for s in steps),
        "gen_s": med(s["generate_s"] for s in steps),
        "train_s": med(s["train_s"] for s in steps),
        "gen_tok_s": med(s["gen_tokens"] / max(s["generate_s"], 1e-9) for s in steps),
        "train_tok_s": med(s["train_tokens"] / max(s["train_s"], 1e-9) for s in steps),
        "rss_mb": run["peak_rss_mb"],
        "final_acc": run["accuracy"][max(run["accuracy"])],
        "ttt_s": reach,
    }


def fmt(values: list[float | None], digits: int = 2) -> str:
    """median (min-max) of the values that exist, with a count when some are missing."""
    have = [v for v in values if v is not None]
    if not have:
        return f"never (0/{len(values)})"
    text = f"{statistics.median(have):.{digits}f} ({min(have):.{digits}f}-{max(have):.{digits}f})"
    return text if len(have) == len(values) else f"{text} [{len(have)}/{len(values)}]"


COLUMNS = (
    ("s / step", "s_step", 2), ("generate s", "gen_s", 2), ("train s", "train_s", 2),
    ("gen tok/s", "gen_tok_s", 0), ("train tok/s", "train_tok_s", 0), ("peak RSS MB", "rss_mb", 0),
    ("final held-out acc", "final_acc", 3), ("s to target", "ttt_s", 1),
)  # fmt: skip
# looprl's advantage per column: TRL / looprl for seconds and memory, looprl / TRL for rates
LOWER_IS_BETTER = {"s_step": True, "gen_s": True, "train_s": True, "rss_mb": True, "ttt_s": True,
                   "gen_tok_s": False, "train_tok_s": False}  # fmt: skip


def print_task(
    task: str, spec: dict[str, Any], runs: dict[str, list[dict]], args: argparse.Namespace
) -> None:
    """The table, the pairwise ratios, the curves and the roofline lines of one task."""
    from rich.console import Console
    from rich.table import Table

    from benchmarks.roofline import roofline_line

    console = Console(width=220)
    figs = {side: [per_run(r, args.target) for r in runs[side]] for side in SIDES}
    table = Table(title=f"{task}: {args.steps} steps x {args.prompts}x{args.generations}, "
                  f"{args.max_tokens} tokens, {len(runs['looprl'])} runs each, median (min-max)")  # fmt: skip
    table.add_column("framework")
    for name, _, _ in COLUMNS:
        table.add_column(name, justify="right")
    for side in SIDES:
        table.add_row(side, *(fmt([f[key] for f in figs[side]], d) for _, key, d in COLUMNS))
    ratios = []
    for _, key, _ in COLUMNS:
        if key not in LOWER_IS_BETTER:
            ratios.append("")
            continue
        num, den = ("trl", "looprl") if LOWER_IS_BETTER[key] else ("looprl", "trl")
        pairs = [(a[key], b[key]) for a, b in zip(figs[num], figs[den], strict=True)]
        ratios.append(fmt([x / y if x is not None and y else None for x, y in pairs]))
    table.add_row("looprl x better", *ratios)
    console.print(table)
    console.print("looprl x better: pairwise ratio, run r of TRL against run r of looprl (TRL / looprl "
                  "for seconds and memory, looprl / TRL for tokens/s); > 1 means looprl is ahead")  # fmt: skip
    for side in SIDES:
        curve = [
            statistics.median(r["steps"][i]["reward"] for r in runs[side])
            for i in range(args.steps)
        ]
        acc = {
            s: statistics.median(r["accuracy"][s] for r in runs[side])
            for s in runs[side][0]["accuracy"]
        }
        console.print(
            f"reward curve {side} (median per step): " + " ".join(f"{v:.2f}" for v in curve)
        )
        console.print(
            f"held-out acc {side} (median, by step): "
            + " ".join(f"{s}:{v:.3f}" for s, v in acc.items())
        )
        tok = statistics.median(f["train_tok_s"] or 0.0 for f in figs[side])
        console.print(
            roofline_line(f"{task} {side} training", 3 * args.flops_per_token, tok, args.roof)
        )
    fwd = [
        s["forward_tokens"] / max(s["train_tokens"], 1) for r in runs["looprl"] for s in r["steps"]
    ]
    console.print(f"looprl forwarded {statistics.median(fwd):.0%} of the batch's completion tokens "
                  "(zero-advantage samples skipped); TRL forwards all of them")  # fmt: skip
