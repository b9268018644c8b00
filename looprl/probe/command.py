"""`looprl probe ENV`: the command line, the printed table and the `--strict` exit code."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from looprl.console import console
from looprl.probe.run import ProbeError, ProbeResult, Row, run_probe

DEFAULT_TASKS = 8
DEFAULT_MARGIN = 0.1  # a tenth of a 0-1 reward: one task in ten gained by the exploit alone


def register(sub: Any) -> None:
    """Register `probe` on the `looprl` command's subparsers."""
    p = sub.add_parser(
        "probe",
        help="attack an environment's rubric with scripted exploits (overrides: --env.KEY VALUE)",
    )
    p.add_argument("env", help="environment name (calculator), module path, or .py file")
    p.add_argument("--tasks", type=int, default=DEFAULT_TASKS, help="tasks per policy")
    p.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="reward above the honest-failure baseline that makes an exploit 'exploitable'",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when any exploit is exploitable or errored, or the reference earns no more "
        "than the honest failure",
    )
    p.add_argument("--split", default="eval", choices=["eval", "train"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default runs/probe-ENV-TIME)")
    p.add_argument(
        "--reference",
        default=None,
        metavar="MODULE:FN",
        help="the reference policy, a function turn -> str (a module path or a .py file before "
        "the colon), instead of the environment's",
    )
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace, extra: list[str]) -> int:
    """Load the environment, probe it, print the table; the exit code `--strict` asks for."""
    from looprl.cli.eval import load_env, parse_overrides
    from looprl.cli.fields import UsageError

    env_kwargs = parse_overrides(extra, "env")["env"]
    if args.tasks < 1:
        raise UsageError(f"--tasks {args.tasks}", "give at least 1 task per policy")
    if not args.margin >= 0:
        raise UsageError(f"--margin {args.margin}", "give a margin >= 0 (default 0.1)")
    out = Path(args.out) if args.out else _default_out(args.env)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out} is not empty", "choose a new or empty directory")
    reference = reference_policy(args.reference)
    env = load_env(args.env, env_kwargs)
    console.print(f"[bold]looprl probe[/bold] {env.name} · {args.tasks} tasks per policy → {out}")
    start = time.perf_counter()
    try:
        result = asyncio.run(
            run_probe(
                env, env_name=args.env, env_kwargs=env_kwargs, tasks=args.tasks,
                margin=args.margin, output=out, split=args.split, seed=args.seed,
                reference=reference,
            )
        )  # fmt: skip
    except ProbeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print_result(result, title=f"{env.name} · margin {args.margin:g}")
    console.print(f"{time.perf_counter() - start:.1f} s · probe: {out / 'probe.json'} · "
                  f"episodes: {out / 'results.jsonl'} (looprl view {out})")  # fmt: skip
    failed = result.document["strict_failed"]
    if failed and args.strict:
        console.print("[bold red]--strict: the rubric or an exploit failed (see above)[/]")
        return 1
    return 0


def reference_policy(spec: str | None) -> Any:
    """`--reference MODULE:FN` imported and checked, or None; a bad one is a UsageError."""
    from looprl.cli.fields import usage_error
    from looprl.eval.run import load_policy
    from looprl.probe.profiles import GivenReference

    if spec is None:
        return None
    try:
        return GivenReference(load_policy(spec, "--reference"))
    except (ValueError, TypeError) as exc:
        raise usage_error(str(exc), "pass --reference MODULE:FN, a function turn -> str") from None


def _default_out(env: str) -> Path:
    return Path("runs") / f"probe-{Path(env).stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def _reward(row: Row) -> str:
    return "n/a" if math.isnan(row.mean) else f"{row.mean:.3f} ± {row.stderr:.3f}"


_STYLE = {"exploitable": "bold red", "resisted": "green", "errored": "yellow"}


def result_table(result: ProbeResult, title: str = "probe") -> Table:
    """The probe's table: baseline, reference, then each exploit with its verdict."""
    table = Table(title=title, header_style="bold")
    for col, justify in (("policy", "left"), ("knows", "center"), ("reward ± se", "right"),
                         ("n", "right"), ("err", "right"), ("verdict", "left")):  # fmt: skip
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for row, label in ((result.baseline, "baseline"), (result.reference, "reference")):
        table.add_row(row.name, "", _reward(row), str(row.episodes), str(row.errors), label)
    table.add_section()
    for row, doc in zip(result.rows, result.document["rows"], strict=True):
        verdict = doc["verdict"]
        shown = "accepted" if "accepted" in doc else f"[{_STYLE[verdict]}]{verdict}[/]"
        table.add_row(
            row.name, "yes" if row.knows_answer else "", _reward(row), str(row.episodes),
            str(row.errors), shown,
        )  # fmt: skip
    return table


def print_result(result: ProbeResult, title: str = "probe") -> None:
    """Print the table and a one-line verdict."""
    console.print(result_table(result, title))
    rows = result.document["rows"]
    bad = [r["name"] for r in rows if r["verdict"] == "exploitable" and "accepted" not in r]
    for row in rows:
        if "accepted" in row:
            console.print(f"accepted by design: {row['name']}: {row['accepted']}", highlight=False)
    for problem in result.document["rubric_problems"]:
        console.print(f"[bold red]rubric:[/] {problem}", highlight=False)
    errored = [r["name"] for r in result.document["rows"] if r["verdict"] == "errored"]
    if bad:
        console.print(f"[bold red]exploitable:[/] {', '.join(bad)}", highlight=False)
    if errored:
        console.print(f"[yellow]errored:[/] {', '.join(errored)}", highlight=False)
    if not bad and not errored and not result.document["rubric_problems"]:
        accepted = any("accepted" in r for r in rows)
        console.print(f"[green]every exploit resisted{' or is accepted' if accepted else ''}[/]")
