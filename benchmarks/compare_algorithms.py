"""Compare the RL presets on the calculator with the tiny model: same budget, several seeds.

Each (preset, seed) run starts from the same warm-started model (the demo's SFT output, or
`--init DIR`), trains for `--steps` steps with the same batch, and is evaluated on the same
held-out tasks every `--eval-every` steps. Prints final held-out accuracy (mean ± std over
seeds), steps and wall-clock to reach `--target`, and writes one plot of held-out accuracy.

    .venv/bin/python benchmarks/compare_algorithms.py --init runs/demo/sft --steps 20 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from looprl.algorithms.presets import PRESETS
from looprl.trainer.config import load_config
from looprl.trainer.plots import plot_comparison
from looprl.trainer.trainer import Trainer

console = Console(width=200)  # a table, not a terminal layout: never wrap or cut columns


def run_one(args: argparse.Namespace, preset: str, seed: int) -> list[dict]:
    """Train one (preset, seed) and return its metric rows."""
    name = f"{preset}-s{seed}"
    overrides = {
        "model.name": str(args.init),
        "algorithm.preset": preset,
        "trainer.steps": args.steps,
        "trainer.seed": seed,
        "trainer.eval_every": args.eval_every,
        "trainer.eval_before": True,
        "trainer.eval_tasks": args.eval_tasks,
        "trainer.save_every": args.steps,
        "trainer.save_rollouts": 0,
        "rollout.tasks_per_step": args.tasks_per_step,
        "rollout.rollouts_per_task": args.rollouts,
        "run.output_dir": str(args.out),
        "run.name": name,
        "run.tensorboard": False,
    }
    cfg = load_config(
        Path(__file__).parents[1] / "looprl" / "recipes" / "calculator_tiny.toml", overrides
    )
    run_dir = args.out / name
    if (run_dir / "metrics.jsonl").exists() and (run_dir / "final").exists():
        console.print(f"[dim]reusing {run_dir}[/dim]")
    else:
        Trainer(cfg).run()
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def first_reach(rows: list[dict], key: str, target: float) -> tuple[int | None, float | None]:
    """(step, wall seconds) at which `key` first reached `target`, or (None, None)."""
    for r in rows:
        if r.get(key) is not None and r[key] >= target:
            return r["step"], r["wall_time"]
    return None, None


def _print_paired(results: dict[str, list[list[dict]]], key: str, seeds: list[int]) -> None:
    """Start and final accuracy per seed, and each preset's final minus grpo's on the same seed."""

    def final(rows: list[dict]) -> float:
        return [r[key] for r in rows if r.get(key) is not None][-1]

    start = [
        [r[key] for r in rows if r.get(key) is not None][0] for rows in next(iter(results.values()))
    ]
    console.print(f"start accuracy per seed {seeds}: " + " / ".join(f"{a:.3f}" for a in start))
    base = results.get("grpo")
    for preset, runs in results.items():
        line = " / ".join(f"{final(rows):.3f}" for rows in runs)
        if base is not None:
            diffs = " / ".join(
                f"{final(a) - final(b):+.3f}" for a, b in zip(runs, base, strict=True)
            )
            line += f"   vs grpo on the same seed: {diffs}"
        console.print(f"{preset:>12} final per seed: {line}")


def main() -> None:
    """Run every preset for every seed and print the comparison."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--init", type=Path, default=Path("runs/demo/sft"), help="warm-started model directory"
    )
    p.add_argument("--presets", nargs="+", default=sorted(PRESETS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--eval-tasks", type=int, default=64)
    p.add_argument("--tasks-per-step", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--target", type=float, default=0.3, help="held-out accuracy to reach")
    p.add_argument("--out", type=Path, default=Path("runs/compare"))
    args = p.parse_args()
    if not (args.init / "config.json").exists():
        raise SystemExit(
            f"{args.init} is not a model directory; run `make demo` first or pass --init DIR"
        )
    key = "eval/correct_answer"
    results: dict[str, list[list[dict]]] = {}
    t0 = time.perf_counter()
    for preset in args.presets:
        results[preset] = [run_one(args, preset, seed) for seed in args.seeds]
    table = Table(
        title=f"calculator, tiny model, {args.steps} steps x {args.tasks_per_step}x{args.rollouts} rollouts, seeds {args.seeds}"
    )
    for col in (
        "preset",
        "final acc (mean ± std)",
        "min / max",
        f"steps to {args.target}",
        "wall s to target",
        "s / step",
    ):
        table.add_column(col, justify="right")
    series, bands = _table_rows(table, results, key, args.target)
    console.print(table)
    _print_paired(results, key, args.seeds)
    plot = plot_comparison(
        series,
        args.out / "comparison.png",
        "held-out accuracy by preset (mean ± std over seeds)",
        "step",
        "accuracy",
        bands=bands,
    )
    console.print(f"plot: {plot}\ntotal {time.perf_counter() - t0:.0f} s")


def _table_rows(
    table: Table, results: dict[str, list[list[dict]]], key: str, target: float
) -> tuple[dict[str, list], dict[str, list]]:
    """Add one row per preset; return the mean curves and their ± std bands for the plot."""
    series: dict[str, list] = {}
    bands: dict[str, list] = {}
    for preset, runs in results.items():
        finals = [[r[key] for r in rows if r.get(key) is not None][-1] for rows in runs]
        reach = [first_reach(rows, key, target) for rows in runs]
        steps = [s for s, _ in reach if s is not None]
        walls = [w for _, w in reach if w is not None]
        per_step = statistics.median(rows[-1]["wall_time"] / rows[-1]["step"] for rows in runs)
        table.add_row(
            preset,
            f"{statistics.fmean(finals):.3f} ± {statistics.pstdev(finals):.3f}",
            f"{min(finals):.3f} / {max(finals):.3f}",
            f"{statistics.fmean(steps):.1f} ({len(steps)}/{len(runs)})"
            if steps
            else f"never (0/{len(runs)})",
            f"{statistics.fmean(walls):.0f}" if walls else "-",
            f"{per_step:.1f}",
        )
        evals = {}
        for rows in runs:
            for r in rows:
                if r.get(key) is not None:
                    evals.setdefault(r["step"], []).append(r[key])
        series[preset] = [(s, statistics.fmean(v)) for s, v in sorted(evals.items())]
        bands[preset] = [
            (
                s,
                statistics.fmean(v) - statistics.pstdev(v),
                statistics.fmean(v) + statistics.pstdev(v),
            )
            for s, v in sorted(evals.items())
        ]
    return series, bands


if __name__ == "__main__":
    main()
