"""Compare the RL presets on the calculator in several training regimes: same budget, several seeds.

Every (preset, regime, seed) run starts from the same warm-started model (the demo's SFT output,
or `--init DIR`), trains `--steps` steps on the same batches and is evaluated on the same held-out
tasks before training and every `--eval-every` steps. A regime is a number of optimizer passes
over each batch (`--updates-per-batch`, algorithm.updates_per_batch: the clips only act when
there are several) and a bound on staleness (`--max-async-steps`, trainer.max_async_steps:
batches generated up to k steps ahead). By default each listed value is varied alone from the
on-policy baseline (`--updates-per-batch 1 2 4 --max-async-steps 0 1 2` gives five regimes);
`--grid` runs every combination.

The sweep is resumable (benchmarks/compare_runs.py): rerun the same command after a stop and
finished runs are read back, interrupted ones continue from their last checkpoint (every
`--save-every` steps, default `--eval-every`). Batches are never generated ahead across a
checkpoint (so a resumed run regenerates them exactly), so each checkpoint drains the async
pipeline for one step: a larger `--save-every` keeps async runs nearer their steady state, and
`summary.json` gives each run's mean `staleness` to show what ran. It writes `summary.json` (every run, its status and
statistics), two plots per regime (held-out accuracy against steps and against wall-clock; with
`--also-plot KEY ...` one more against steps for each metrics.jsonl key), and
prints a markdown table for docs/results.md (benchmarks/compare_report.py says what each column
means, and the collapse rule).

    .venv/bin/python -m benchmarks.compare_algorithms --init runs/demo/sft --steps 20 --seeds 0 1 2 \\
        --updates-per-batch 1 2 4 --max-async-steps 0 1 2

Any other `--section.field VALUE` is a training-config override for every run (as in
`looprl train`), e.g. `--recipe examples/calculator_smollm2.toml --init runs/smol-sft` for
SmolLM2 with LoRA.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any

from benchmarks.compare_report import RunStats, markdown_table, plot_metric, run_stats
from benchmarks.compare_runs import RunResult, run_resumable
from looprl.algorithms.presets import PRESETS
from looprl.console import console
from looprl.trainer.config import ConfigError, load_config, parse_cli_overrides
from looprl.trainer.metrics import check_metric_name

RECIPE = Path(__file__).parents[1] / "looprl" / "recipes" / "calculator_tiny.toml"
KEY = "eval/correct_answer"


@dataclasses.dataclass(frozen=True)
class Regime:
    """How off-policy the training is: optimizer passes per batch, batches generated ahead."""

    updates: int
    ahead: int

    @property
    def label(self) -> str:
        """`on-policy`, `2 updates/batch`, `async k=1`, or both joined."""
        parts = [f"{self.updates} updates/batch"] * (self.updates > 1)
        parts += [f"async k={self.ahead}"] * (self.ahead > 0)
        return ", ".join(parts) or "on-policy"

    @property
    def tag(self) -> str:
        """The part of a run name that names the regime (`u2-a0`)."""
        return f"u{self.updates}-a{self.ahead}"


def regimes(updates: list[int], ahead: list[int], grid: bool) -> list[Regime]:
    """Every combination (`grid`), else each value varied alone from the smallest of each."""
    if grid:
        return [Regime(u, a) for u in sorted(set(updates)) for a in sorted(set(ahead))]
    u0, a0 = min(updates), min(ahead)
    found = [Regime(u, a0) for u in sorted(set(updates))]
    found += [Regime(u0, a) for a in sorted(set(ahead)) if a != a0]
    return found


def run_config(args: argparse.Namespace, preset: str, regime: Regime, seed: int) -> Any:
    """The training config of one (preset, regime, seed) run."""
    overrides = {
        **args.overrides,
        "model.name": str(args.init),
        "algorithm.preset": preset,
        "algorithm.updates_per_batch": regime.updates,
        "trainer.max_async_steps": regime.ahead,
        "trainer.steps": args.steps,
        "trainer.seed": seed,
        "trainer.eval_every": args.eval_every,
        "trainer.eval_before": True,
        "trainer.eval_tasks": args.eval_tasks,
        "trainer.save_every": args.save_every or args.eval_every or args.steps,
        "trainer.keep_last": 1,
        "trainer.save_rollouts": 0,
        "rollout.tasks_per_step": args.tasks_per_step,
        "rollout.rollouts_per_task": args.rollouts,
        "run.tensorboard": False,
    }
    return load_config(args.recipe, overrides)


def sweep(args: argparse.Namespace) -> list[tuple[str, Regime, int, RunResult]]:
    """Run (or read back) every (seed, regime, preset), seed-major so a stopped sweep has whole
    seeds to show; returns them in that order."""
    plan = [
        (p, r, s)
        for s in args.seeds
        for r in regimes(args.updates_per_batch, args.max_async_steps, args.grid)
        for p in args.presets
    ]
    done = []
    for i, (preset, regime, seed) in enumerate(plan, 1):
        name = f"{preset}-{regime.tag}-s{seed}"
        cfg = run_config(args, preset, regime, seed)
        result = run_resumable(
            cfg,
            args.out / name,
            keep_checkpoints=args.keep_checkpoints,
            finished_only=args.report_only,
        )
        note = f" from step {result.resumed_from[-1]}" if result.status == "resumed" else ""
        console.print(f"[bold]run {i}/{len(plan)}[/bold] {name}: {result.status}{note}")
        done.append((preset, regime, seed, result))
    return done


def report(args: argparse.Namespace, done: list[tuple[str, Regime, int, RunResult]]) -> str:
    """Write summary.json and the plots; return the markdown table."""
    stats = {
        (p, r.label, s): run_stats(
            res.rows,
            KEY,
            args.target,
            margin=args.collapse_margin,
            entropy_ratio=args.entropy_collapse,
        )  # fmt: skip
        for p, r, s, res in done
        if res.status not in ("busy", "missing")
    }
    groups: dict[tuple[str, str], list[RunStats]] = {}
    for (p, label, _), st in stats.items():
        groups.setdefault((p, label), []).append(st)
    runs = [
        {"preset": p, "regime": r.label, "updates_per_batch": r.updates,
         "max_async_steps": r.ahead, "seed": s, "run": res.name, "status": res.status,
         "resumed_from": res.resumed_from,
         **(dataclasses.asdict(stats[p, r.label, s]) if (p, r.label, s) in stats else {})}
        for p, r, s, res in done
    ]  # fmt: skip
    table = markdown_table(groups, args.target)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    summary = {"settings": settings, "metric": KEY, "runs": runs, "table": table}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    for regime in {r for _, r, _, _ in done}:
        curves = {
            p: [res.rows for q, r, _, res in done if q == p and r == regime and res.rows]
            for p in args.presets
        }
        plots = plot_metric(curves, KEY, args.out / f"accuracy-{regime.tag}.png", regime.label)
        for key in args.also_plot:  # a metric of metrics.jsonl, against steps
            if not any(r.get(key) is not None for g in curves.values() for rows in g for r in rows):
                console.print(
                    f"[yellow]--also-plot {key}: no run recorded it; not plotted[/yellow]"
                )
                continue
            name = re.sub(r"[^A-Za-z0-9]+", "_", key).strip("_")
            out = args.out / f"{name}-{regime.tag}.png"
            plots += plot_metric(curves, key, out, regime.label, key, xs=("step",))
        console.print("plots: " + ", ".join(str(p) for p in plots))
    return table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags; unknown `--section.field VALUE` pairs become config overrides (`overrides`)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--init", default="runs/demo/sft", help="warm-started model (dir or tiny)")
    p.add_argument(
        "--recipe", type=Path, default=RECIPE, help="training config every run starts from"
    )
    p.add_argument("--presets", nargs="+", default=sorted(PRESETS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--updates-per-batch", nargs="+", type=int, default=[1], metavar="K")
    p.add_argument("--max-async-steps", nargs="+", type=int, default=[0], metavar="K")
    p.add_argument("--grid", action="store_true", help="every updates x async combination")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument(
        "--save-every", type=int, default=None, help="checkpoint period (default: --eval-every)"
    )
    p.add_argument("--eval-tasks", type=int, default=64)
    p.add_argument("--tasks-per-step", type=int, default=16)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--target", type=float, default=0.3, help="held-out accuracy to reach")
    p.add_argument(
        "--collapse-margin", type=float, default=0.1, help="accuracy drop that flags a collapse"
    )
    p.add_argument(
        "--entropy-collapse", type=float, default=0.25, help="entropy ratio that flags a collapse"
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="read back finished runs and report them; start or resume nothing",
    )
    p.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep finished runs' checkpoints (to extend them)",
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: two sweeps share 2 cores)"
    )
    p.add_argument(
        "--also-plot",
        nargs="+",
        default=[],
        metavar="KEY",
        help="more per-regime plots against steps, of these metrics.jsonl keys "
        "(e.g. reward/answer_format eval/answer_format policy/entropy)",
    )
    p.add_argument("--out", type=Path, default=Path("runs/compare"))
    args, extra = p.parse_known_args(argv)
    try:
        args.overrides = parse_cli_overrides(extra)
    except ConfigError as exc:
        p.error(f"{exc} (unknown flags are read as --section.field VALUE config overrides)")
    bad = sorted(set(args.presets) - set(PRESETS))
    if bad:
        p.error(f"unknown preset(s) {bad}; choose from {sorted(PRESETS)}")
    for key in args.also_plot:
        try:
            check_metric_name(key)
        except ValueError as exc:
            p.error(f"--also-plot: {exc}")
    if min(args.updates_per_batch) < 1 or min(args.max_async_steps) < 0:
        p.error("--updates-per-batch values must be >= 1 and --max-async-steps values >= 0")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the sweep (or read it back) and print the comparison."""
    import torch

    from looprl.models.loading import BUILTIN_MODELS

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.init not in BUILTIN_MODELS and not (Path(args.init) / "config.json").exists():
        raise SystemExit(
            f"{args.init} is not a model directory; run `make demo` first or pass --init DIR"
        )
    t0 = time.perf_counter()
    done = sweep(args)
    if args.report_only and all(res.status in ("missing", "busy") for *_, res in done):
        raise SystemExit(
            f"no finished run in {args.out} matches these presets, regimes and seeds; check --out "
            "and give the options the sweep ran with"
        )
    table = report(args, done)
    busy = [res.name for *_, res in done if res.status == "busy"]
    missing = [res.name for *_, res in done if res.status == "missing"]
    resumed = [f"{res.name} (from {res.resumed_from})" for *_, res in done if res.resumed_from]
    console.print(table, highlight=False, soft_wrap=True)
    console.print(f"resumed runs: {', '.join(resumed) or 'none'}", highlight=False, soft_wrap=True)
    if busy:
        console.print(f"[yellow]left out (another sweep is running them): {', '.join(busy)}[/]")
    if missing:
        console.print(f"[yellow]left out (not finished; --report-only): {', '.join(missing)}[/]")
    console.print(f"summary: {args.out / 'summary.json'}\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
