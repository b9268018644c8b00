"""Tools vs no tools: the same model and RL budget on the same arithmetic, with and without `calculate`.

Two variants of the calculator on the same tasks (operands of each `--digits` size, the size kept
in each task's info): `tools` (the `calculator` environment: call `calculate`, then answer) and
`text` (`calculator_text`: no tool, work it out in text, then answer). Each variant:

1. warm start (`--warm-start N`, 0 to skip): N training tasks played by its scripted teacher
   (`looprl.sft.teachers.calculator`: the tool call, then the answer; `calculator_text.worked_answer`:
   the operations one a line, then the answer), then `looprl sft` on those traces;
2. RL: `--steps` GRPO steps (LoRA on SmolLM2-135M by default), evaluated on the same held-out
   tasks before training and at the end;
3. held-out accuracy per operand size, before and after, mean over `--seeds`.

Same budget: the same steps, tasks and rollouts per step, learning rate and generated-token
ceiling per episode (`tools`: 3 turns of 64 tokens, `text`: 1 turn of 192). Resumable like
compare_algorithms: rerun the same command and finished stages are read back, an interrupted RL
run continues from its last checkpoint (every `--eval-every` steps).

    .venv/bin/python -m benchmarks.tools_vs_text                    # SmolLM2-135M, LoRA (hours)
    .venv/bin/python -m benchmarks.tools_vs_text --model tiny --steps 2 --warm-start 16  # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.compare_runs import RunResult, run_resumable
from looprl.console import console
from looprl.envs.calculator_text import worked_answer
from looprl.envs.registry import load_environment
from looprl.sft.teachers import calculator as tool_teacher
from looprl.sft.teachers import sft_rows, teacher_episodes
from looprl.trainer.config import ConfigError, load_config, parse_cli_overrides

VARIANTS: dict[str, dict[str, Any]] = {
    "tools": {"env": "calculator", "kwargs": {"max_turns": 3, "max_tokens_per_turn": 64}},
    "text": {"env": "calculator_text", "kwargs": {"max_tokens_per_turn": 192}},
}
TEACHERS = {"tools": tool_teacher, "text": worked_answer}


def warm_start(args: argparse.Namespace, variant: str, out: Path) -> str:
    """The model RL starts from: `--model`, or its SFT on N teacher traces (made once, then reused)."""
    if args.warm_start == 0:
        return str(args.model)
    model_dir = out / "sft"
    if (model_dir / "config.json").exists():
        console.print(f"[dim]{variant}: reusing the warm start {model_dir}[/dim]")
        return str(model_dir)
    spec = VARIANTS[variant]
    env = load_environment(spec["env"], **spec["kwargs"], digits=args.digits)
    tasks = env.get_tasks("train", args.warm_start, seed=1000)  # not the RL run's task stream
    policy = TEACHERS[variant]
    episodes = asyncio.run(teacher_episodes(env, lambda task: policy, tasks))
    rows = sft_rows(env, episodes, 0.0)
    if not rows:
        raise SystemExit(
            f"{variant}: the teacher solved none of {len(tasks)} tasks; nothing to SFT on"
        )
    traces = out / "traces.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    traces.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    console.print(f"{variant}: {len(rows)} teacher traces of {len(tasks)} tasks -> {traces}")
    command = [
        sys.executable, "-m", "looprl.cli.main", "sft", "--data", str(traces), "--model", str(args.model),
        "--output", str(model_dir), "--epochs", str(args.sft_epochs), "--lr", str(args.sft_lr),
        "--batch-size", "8", "--micro-batch-tokens", "2048",
    ]  # fmt: skip
    subprocess.run(command, check=True)  # its own process: the SFT model's memory goes with it
    return str(model_dir)


def rl_config(args: argparse.Namespace, variant: str, init: str, seed: int) -> Any:
    """The RL run's config: the same for both variants but the environment."""
    spec = VARIANTS[variant]
    lora = args.lora if args.lora is not None else args.model != "tiny"
    overrides = {
        "model.name": init,
        "model.lora": lora,
        "env.name": spec["env"],
        "env.kwargs": {**spec["kwargs"], "digits": args.digits},
        "rollout.tasks_per_step": args.tasks_per_step,
        "rollout.rollouts_per_task": args.rollouts,
        "algorithm.preset": args.preset,
        "optim.lr": args.lr,
        "optim.warmup_steps": 2,
        "trainer.steps": args.steps,
        "trainer.seed": seed,
        "trainer.eval_before": True,
        "trainer.eval_every": args.eval_every,
        "trainer.eval_tasks": args.eval_tasks,
        "trainer.save_every": args.eval_every or args.steps,
        "trainer.keep_last": 1,
        "trainer.save_rollouts": 4,
        "trainer.micro_batch_tokens": 4096,
        "run.tensorboard": False,
        **args.overrides,
    }
    return load_config(None, overrides)


def per_size(run_dir: Path, step: int) -> dict[int, list[float]]:
    """Held-out `correct_answer` per operand size at the evaluation of `step`."""
    path = run_dir / "eval" / f"step_{step:06d}" / "results.jsonl"
    found: dict[int, list[float]] = {}
    for line in path.read_text("utf-8").splitlines():
        row = json.loads(line)
        found.setdefault(row["task"]["info"]["digits"], []).append(row["rewards"]["correct_answer"])
    return found


def size_table(results: dict[str, list[tuple[Path, int]]]) -> tuple[str, list[dict[str, Any]]]:
    """The markdown table (variant x operand size: before, after, change) and its rows."""
    lines = [
        "| variant | operand digits | held-out tasks | before RL | after RL | change |",
        "|---|---|---|---|---|---|",
    ]
    records = []
    for variant, runs in results.items():
        before: dict[Any, list[float]] = {}
        after: dict[Any, list[float]] = {}
        for run_dir, steps in runs:
            for into, step in ((before, 0), (after, steps)):
                for size, values in per_size(run_dir, step).items():
                    into.setdefault(size, []).extend(values)
                    into.setdefault("all", []).extend(values)
        for size in [*sorted(k for k in before if k != "all"), "all"]:
            b, a = statistics.fmean(before[size]), statistics.fmean(after[size])
            n = len(before[size])
            lines.append(f"| {variant} | {size} | {n} | {b:.3f} | {a:.3f} | {a - b:+.3f} |")
            records.append({"variant": variant, "digits": size, "n": n, "before": b, "after": a})
    return "\n".join(lines), records


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags; unknown `--section.field VALUE` pairs become RL config overrides."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model", default="smollm2-135m", help="smollm2-135m, tiny or a model directory"
    )
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--digits", nargs="+", type=int, default=[1, 2, 3], help="operand sizes")
    p.add_argument("--warm-start", type=int, default=160, help="teacher traces to SFT on (0: none)")
    p.add_argument("--sft-epochs", type=float, default=1.0)
    p.add_argument("--sft-lr", type=float, default=1e-4)
    p.add_argument("--lora", action=argparse.BooleanOptionalAction, default=None,
                   help="LoRA for RL (default: on, off for tiny)")  # fmt: skip
    p.add_argument("--preset", default="grpo")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--eval-every", type=int, default=6)
    p.add_argument("--eval-tasks", type=int, default=96)
    p.add_argument("--tasks-per-step", type=int, default=8)
    p.add_argument("--rollouts", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--out", type=Path, default=Path("runs/tools_vs_text"))
    args, extra = p.parse_known_args(argv)
    try:
        args.overrides = parse_cli_overrides(extra)
    except ConfigError as exc:
        p.error(f"{exc} (unknown flags are read as --section.field VALUE config overrides)")
    return args


def main(argv: list[str] | None = None) -> None:
    """Warm-start, train and evaluate each variant (or read them back); print the per-size table."""
    import torch

    args = parse_args(argv)
    torch.set_num_threads(1)  # one thread per job: two jobs share the 2 cores
    results: dict[str, list[tuple[Path, int]]] = {}
    statuses: list[RunResult] = []
    for variant in args.variants:
        out = args.out / variant
        init = warm_start(args, variant, out)
        for seed in args.seeds:
            cfg = rl_config(args, variant, init, seed)
            result = run_resumable(cfg, out / f"rl-s{seed}")
            if result.status == "busy":
                raise SystemExit(f"{out / f'rl-s{seed}'} is being run by another process")
            console.print(f"[bold]{variant} seed {seed}[/bold]: {result.status}")
            statuses.append(result)
            results.setdefault(variant, []).append((out / f"rl-s{seed}", args.steps))
    table, records = size_table(results)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    runs = [{"run": r.name, "status": r.status, "resumed_from": r.resumed_from} for r in statuses]
    summary = {"settings": settings, "runs": runs, "per_size": records, "table": table}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(table, highlight=False, soft_wrap=True)
    console.print(f"summary: {args.out / 'summary.json'}")


if __name__ == "__main__":
    main()
