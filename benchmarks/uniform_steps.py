"""Steps without signal, run by run: how many, whether they were skipped, and the answer format.

Reads the runs of `benchmarks.compare_algorithms` sweeps (one `--out` folder each, e.g. one
with `--trainer.skip_uniform_steps true` and one with `false`) and prints one markdown row per
run: its preset, `trainer.skip_uniform_steps`, seed, the steps where every group scored alike
(`train/zero_var_frac` 1: no gradient), how many of them took no optimizer step
(`train/uniform_steps_skipped`), held-out accuracy and answer format at each evaluation, and the
answer format of the training batches (mean over the last five steps, and its lowest).

    .venv/bin/python -m benchmarks.uniform_steps runs/zs_skip runs/zs_noskip

Runs of one seed sample the same batches until the first step where the two settings differ (a
no-gradient step after an informative one), so rows of a seed compare paired.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from looprl.files import iter_jsonl
from looprl.trainer.metrics import upgrade_row

COLUMNS = (
    "preset", "skip", "seed", "no-gradient steps", "skipped", "held-out acc by eval",
    "held-out format by eval", "batch format, last 5 (min)",
)  # fmt: skip


def run_row(run_dir: Path) -> list[str]:
    """The table row of one run directory (its `config.json` and `metrics.jsonl`)."""
    config: dict[str, Any] = json.loads((run_dir / "config.json").read_text())["config"]
    rows = [upgrade_row(r) for _, r in iter_jsonl(run_dir / "metrics.jsonl")]
    train = [r for r in rows if "reward/mean" in r]
    evals = [r for r in rows if "eval/reward" in r]
    flat = [r["step"] for r in train if r.get("train/zero_var_frac", 0.0) >= 1.0]
    skipped = sum(int(r.get("train/uniform_steps_skipped", 0.0)) for r in train)
    fmt = [r["reward/answer_format"] for r in train]
    last = statistics.fmean(fmt[-5:]) if fmt else float("nan")
    return [
        config["algorithm"]["preset"],
        str(config["trainer"].get("skip_uniform_steps", False)).lower(),
        str(config["trainer"]["seed"]),
        f"{len(flat)} of {len(train)}",
        str(skipped),
        " / ".join(f"{r['eval/correct_answer']:.3f}" for r in evals),
        " / ".join(f"{r['eval/answer_format']:.2f}" for r in evals),
        f"{last:.2f} ({min(fmt, default=float('nan')):.2f})",
    ]


def run_dirs(sweeps: list[Path]) -> list[Path]:
    """Every finished run (a `final/` beside its `metrics.jsonl`) under the sweep folders."""
    found = [m.parent for s in sweeps for m in sorted(s.glob("*/metrics.jsonl"))]
    return [d for d in found if (d / "final").is_dir()]


def main(argv: list[str] | None = None) -> None:
    """Print the table of the sweeps given on the command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweeps", nargs="+", type=Path, help="compare_algorithms --out folders")
    args = p.parse_args(argv)
    runs = run_dirs(args.sweeps)
    if not runs:
        raise SystemExit(
            f"no finished run under {', '.join(map(str, args.sweeps))}; check the paths"
        )
    table = sorted((run_row(d) for d in runs), key=lambda r: (r[0], r[2], r[1]))
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
