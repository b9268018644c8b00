"""`make demo`: tiny model -> SFT on an imperfect teacher -> eval -> GRPO -> eval, on the calculator.

The scripted teacher uses the calculator tool only some of the time; otherwise it "answers in
its head" and is usually wrong. SFT copies that habit, so the warm-started model is right only
when it happens to call the tool. RL has to discover that calling the tool pays. Both phases
are evaluated on the same held-out tasks so the gain from RL is separated from SFT's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from looprl.console import console
from looprl.envs.calculator import SYSTEM_PROMPT, generate_tasks, load_environment, safe_eval
from looprl.eval.run import EvalConfig, EvalJob, EvalOutcome, eval_job, run_eval
from looprl.eval.summary import Summary
from looprl.types import Message, ToolCall


def teacher_conversation(
    task_expr: str, answer: str, rng: random.Random, tool_rate: float
) -> list[Message]:
    """One trace of the imperfect teacher for `What is EXPR?`.

    With probability `tool_rate` it calls `calculate` and copies the result; otherwise it
    guesses a nearby number without the tool (wrong almost always).
    """
    msgs = [
        Message(role="system", content=SYSTEM_PROMPT),
        Message(role="user", content=f"What is {task_expr}?"),
    ]
    if rng.random() < tool_rate:
        call = ToolCall(name="calculate", arguments={"expression": task_expr}, id="call_0")
        msgs.append(Message(role="assistant", content="", tool_calls=[call]))
        msgs.append(Message(role="tool", content=answer, tool_call_id="call_0", name="calculate"))
        msgs.append(Message(role="assistant", content=f"The answer is {answer}."))
    else:
        value = int(answer)
        guess = value + rng.choice([-1, 1]) * rng.randint(1, max(10, abs(value) // 10))
        msgs.append(Message(role="assistant", content=f"The answer is {guess}."))
    return msgs


def teacher_rows(
    n: int, seed: int, tool_rate: float, tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`n` teacher conversations on training tasks, as JSONL rows for `looprl sft`."""
    rng = random.Random(seed)
    rows = []
    for task in generate_tasks("train", n, seed=10_000 + seed):
        expr = task.info["expression"]
        assert str(safe_eval(expr)) == task.answer
        msgs = teacher_conversation(expr, task.answer or "", rng, tool_rate)
        rows.append({"messages": [m.to_template() for m in msgs], "tools": tools})
    return rows


def _evaluate(
    model_name: str, out: Path, n: int, r: int, seed: int, temperature: float = 1.0
) -> Summary:
    """Held-out evaluation the way `looprl eval` runs it (fresh output directory); its summary.

    Prints one line (accuracy, tool use, where the results are) instead of `looprl eval`'s
    table: the demo's before/after table at the end shows the rest side by side.
    """
    shutil.rmtree(out, ignore_errors=True)
    cfg = EvalConfig(
        env="calculator", output=out, model=model_name, num_tasks=n, rollouts=r, seed=seed,
        temperature=temperature,
    )  # fmt: skip
    outcome = asyncio.run(_run_and_close(eval_job(cfg)))
    summary = outcome.summary
    how = "greedy" if temperature == 0 else f"T={temperature:g}, {r} per task"
    console.print(
        f"  {how}: accuracy {_accuracy(summary):.3f} · used the tool "
        f"{summary['rewards'].get('used_tool', float('nan')):.3f} · {summary['episodes']} "
        f"episodes in {outcome.seconds:.0f}s → {out}",
        highlight=False,
    )
    if outcome.headline:
        console.print(f"[yellow]{outcome.headline}[/]", highlight=False)
    return summary


async def _run_and_close(job: EvalJob) -> EvalOutcome:
    try:
        return await run_eval(job)
    finally:
        await job.engine.close()


def main(argv: list[str] | None = None) -> int:
    """Run the whole demo and print the before/after table."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="runs/demo")
    p.add_argument(
        "--sft-examples", type=int, default=9600, help="stage-1 tool drills (short prompts)"
    )
    p.add_argument(
        "--full-fraction",
        type=int,
        default=15,
        help="stage-2 traces, as a percent of --sft-examples",
    )
    p.add_argument(
        "--tool-rate", type=float, default=0.3, help="how often the teacher uses the tool"
    )
    p.add_argument("--rl-steps", type=int, default=30)
    p.add_argument("--eval-tasks", type=int, default=100)
    p.add_argument("--eval-rollouts", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    out = Path(args.out)
    t_start = time.perf_counter()
    console.print(
        f"[bold]looprl demo[/bold] · calculator · tiny model: SFT on scripted traces → held-out eval"
        f" → GRPO ({args.rl_steps} steps) → held-out eval → {out}",
        highlight=False,
    )
    sft_dir = _sft_phase(args, out)
    console.rule(f"held-out evaluation after SFT ({args.eval_tasks} tasks)")
    before = _evaluate_both(args, str(sft_dir), out / "eval_before")
    run_dir = _rl_phase(args, out, sft_dir)
    console.rule(f"held-out evaluation after GRPO ({args.eval_tasks} tasks)")
    after = _evaluate_both(args, str(run_dir / "final"), out / "eval_after")
    _print_before_after(before, after, out, run_dir, time.perf_counter() - t_start)
    return 0


def _evaluate_both(args: argparse.Namespace, model: str, out: Path) -> dict[str, Summary]:
    """The same held-out tasks sampled at temperature 1 (`--eval-rollouts` each) and greedily."""
    n, seed = args.eval_tasks, args.seed
    return {
        "sampled": _evaluate(model, out, n, args.eval_rollouts, seed, temperature=1.0),
        "greedy": _evaluate(model, out.with_name(out.name + "_greedy"), n, 1, seed, 0.0),
    }


def _sft_phase(args: argparse.Namespace, out: Path) -> Path:
    """Warm-start the tiny model on scripted traces, in two stages.

    Stage 1 teaches the mechanics (call the tool with the expression copied exactly, copy its
    result into the answer) on traces without the system prompt (about 50 tokens instead of
    250), so the few hundred steps copying takes are cheap. Stage 2 continues on full prompts
    from the imperfect teacher, who uses the tool only `tool_rate` of the time and otherwise
    guesses: the warm-started model inherits that habit, and RL has to unlearn it.
    """
    from looprl.models.loading import load_model
    from looprl.rendering.renderer import Renderer
    from looprl.sft.train import examples_from_rows, sft_train
    from looprl.trainer.checkpoint.single import export_hf
    from looprl.trainer.logger import format_duration
    from looprl.trainer.setup import seed_everything

    env = load_environment()
    drills = teacher_rows(args.sft_examples, args.seed, 1.0, env.tool_schemas)
    n_full = max(1, args.sft_examples * args.full_fraction // 100)
    rows = teacher_rows(n_full, args.seed + 1, args.tool_rate, env.tool_schemas)
    out.mkdir(parents=True, exist_ok=True)
    (out / "teacher.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seed_everything(args.seed)
    model, tokenizer = load_model("tiny")
    short = [
        {"messages": [m for m in r["messages"] if m["role"] != "system"], "tools": []}
        for r in drills
    ]
    # stage 2 keeps drilling (short prompts) beside the full-prompt teacher traces, so learning
    # the teacher's habit in the real context does not wash out the copying skill
    mixed = rows + short[: len(rows)]
    random.Random(args.seed).shuffle(mixed)
    stages = [
        ("tool drills, short prompts (the teacher always uses the tool)", short),
        (
            f"the imperfect teacher on full prompts (tool used {args.tool_rate:.0%} of the time) + drills",
            mixed,
        ),
    ]

    def log(step: int, total: int, loss: float, seconds: float) -> None:
        eta = format_duration(seconds / step * (total - step))
        console.print(
            f"sft step {step:>{len(str(total))}}/{total} │ loss {loss:.4f} │ "
            f"{format_duration(seconds)}, ETA {eta}",
            highlight=False,
        )

    for title, data in stages:
        examples = examples_from_rows(
            lambda tools: Renderer(tokenizer, tools), data, tokenizer.eos_token
        )
        console.rule(f"SFT on {len(data)} traces: {title}")
        sft_train(model, examples, epochs=1.0, lr=1e-3, batch_size=32, seed=args.seed, log=log)
    sft_dir = out / "sft"
    export_hf(model, tokenizer, sft_dir)
    return sft_dir


def _rl_phase(args: argparse.Namespace, out: Path, sft_dir: Path) -> Path:
    from looprl.trainer.config import load_config
    from looprl.trainer.trainer import Trainer

    cfg = load_config(
        Path(__file__).parent.parent / "recipes" / "calculator_tiny.toml",
        {"model.name": str(sft_dir), "trainer.steps": args.rl_steps, "trainer.seed": args.seed,
         "run.output_dir": str(out), "run.name": "grpo"},
    )  # fmt: skip
    console.rule(f"GRPO for {args.rl_steps} steps")
    shutil.rmtree(out / "grpo", ignore_errors=True)  # the demo starts over each time it runs
    trainer = Trainer(cfg)
    trainer.run()
    return trainer.run_dir


def _accuracy(summary: Summary) -> float:
    return float(summary["rewards"].get("correct_answer", float("nan")))


def _print_before_after(
    before: dict[str, Summary],
    after: dict[str, Summary],
    out: Path,
    run_dir: Path,
    seconds: float,
) -> None:
    table = Table(title="held-out calculator tasks")
    table.add_column("metric")
    table.add_column("after SFT", justify="right")
    table.add_column("after GRPO", justify="right")
    table.add_row(
        "accuracy, greedy",
        f"{_accuracy(before['greedy']):.3f}",
        f"{_accuracy(after['greedy']):.3f}",
    )
    rows = [
        ("accuracy, sampled T=1", _accuracy),
        ("tool-call validity", lambda s: s["rewards"].get("tool_call_validity", float("nan"))),
        ("used the tool", lambda s: s["rewards"].get("used_tool", float("nan"))),
        ("answer format", lambda s: s["rewards"].get("answer_format", float("nan"))),
        ("turns / episode", lambda s: s["turns_mean"]),
        ("tokens / episode", lambda s: s["generated_tokens_mean"]),
    ]
    for name, get in rows:
        table.add_row(name, f"{get(before['sampled']):.3f}", f"{get(after['sampled']):.3f}")
    console.print(table)
    greedy = _accuracy(after["greedy"]) - _accuracy(before["greedy"])
    sampled = _accuracy(after["sampled"]) - _accuracy(before["sampled"])
    console.print(
        f"accuracy gain from RL: {greedy * 100:+.1f} points greedy, {sampled * 100:+.1f} sampled"
        f" (demo time {seconds / 60:.1f} min)",
        highlight=False,
    )
    console.print(
        f"run: {run_dir}\nplot: {run_dir / 'plots' / 'curves.png'}\nrollouts: {run_dir / 'rollouts'}"
    )
    console.print(
        f"evals: {out / 'eval_before'}, {out / 'eval_after'} (and *_greedy)\nview: looprl view {run_dir}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
