"""`looprl bootstrap ENV`: expert iteration before RL, then the `looprl train` command that goes on.

The config is `looprl train`'s (`--config TOML`, `--section.field VALUE`) with its `[bootstrap]`
section (docs/config.md); ENV and `--model` set `env.name` and `model.name`. Every check runs
before any work: the config, the model, the environment, the engine (it must sample each
round's new weights) and the teacher server (one `GET /models`). The rounds themselves are
`looprl.sft.bootstrap.run_bootstrap`; this module prints a line per round, the table at the end,
why it stopped and the exact `looprl train` command (`--then-train` runs it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from looprl.cli.fields import Interrupted, UsageError
from looprl.console import console
from looprl.files import write_text_atomically

EPILOG = """\
examples:
  looprl bootstrap calculator --model tiny --env.kwargs.digits 1 --bootstrap.sft_lr 1e-3
  looprl bootstrap calculator --config examples/calculator_smollm2.toml --bootstrap.max_rounds 1
  looprl bootstrap calculator --output runs/boot --resume      # after a kill: the last round goes on
every [bootstrap] field: looprl config show (or docs/config.md)
"""


def register(sub: Any) -> None:
    """Add `looprl bootstrap` to the command line."""
    p = sub.add_parser(
        "bootstrap",
        help="sample, keep the successes, fine-tune, repeat: a warm start without a teacher",
        description="Expert iteration before RL: each round samples attempts at training tasks, "
        "keeps the successes the rubric scores and fine-tunes on them, until GRPO would have "
        "signal or the pass rate stops rising; then prints the looprl train command.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("env", help="environment name (calculator), module path, or .py file")
    p.add_argument("--config", default=None, help="a looprl train TOML config (its [bootstrap])")
    p.add_argument("-m", "--model", default=None, help="the model to bootstrap (model.name)")
    p.add_argument(
        "--output", default=None, help="directory (default runs/bootstrap-ENV-MODEL-TIME)"
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the bootstrap in --output at its last round"
    )
    p.add_argument(
        "--then-train", action="store_true", help="run the printed looprl train command after"
    )
    p.set_defaults(func=run_bootstrap_command)


def run_bootstrap_command(args: argparse.Namespace, dotted: list[str]) -> int:
    """`looprl bootstrap`: check everything, run the rounds, report, hand over."""
    from looprl.sft.bootstrap import SamplingFailed, run_bootstrap

    cfg = bootstrap_config(args, dotted)
    job = bootstrap_job(cfg, args)
    args, dotted = with_invocation(args, dotted, job.output)
    print_start(job)
    try:
        outcome = run_bootstrap(job)
    except SamplingFailed as exc:
        raise SystemExit(f"error: {exc}") from None
    except KeyboardInterrupt:
        raise Interrupted(
            f"the bootstrap stopped; finished rounds and sampled groups are kept in {job.output}",
            f"resume with: {shlex.join(['looprl', *resume_argv(args, job.output)])}",
        ) from None
    print_report(outcome, cfg)
    command = train_command(args, dotted, outcome.handover_model)
    trained = any(r.model for r in outcome.records)
    if outcome.stop == "no_successes" and not trained:
        return 1
    console.print(
        f"model handed over: {outcome.handover_model}\ncontinue with RL:\n  {shlex.join(command)}",
        highlight=False, soft_wrap=True,
    )  # fmt: skip
    if args.then_train:
        return then_train(args.config, command)
    return 0


INVOCATION = "invocation.json"


def with_invocation(
    args: argparse.Namespace, dotted: list[str], output: Path
) -> tuple[argparse.Namespace, list[str]]:
    """The TOML and overrides the bootstrap in `output` was started with, for the `looprl
    train` command it hands over to: recorded there by a first run; a resume typed without
    `--config` takes them back (its own overrides after, so they win)."""
    path = output / INVOCATION
    if not args.resume or not path.is_file():
        record = {"config": args.config, "overrides": dotted}
        write_text_atomically(path, json.dumps(record, indent=2))
        return args, dotted
    if args.config is not None:
        return args, dotted
    record = json.loads(path.read_text(encoding="utf-8"))
    return argparse.Namespace(**{**vars(args), "config": record["config"]}), [
        *record["overrides"],
        *dotted,
    ]


def then_train(config: str | None, command: list[str]) -> int:
    """Run `command` (`train_command`'s words) as `looprl train` runs it, in this process, with
    the memory the bootstrap freed handed back to the OS first."""
    import gc

    from looprl.cli.train import run_train_command
    from looprl.engines.heap import return_free_memory

    gc.collect()
    return_free_memory()

    train = argparse.Namespace(
        config=config, resume=False, force=False, run_dir=None, nproc=1, argv=command[1:]
    )
    return run_train_command(train, command[3 if config else 2 :])


def bootstrap_config(args: argparse.Namespace, dotted: list[str]) -> Any:
    """The `TrainConfig`: the TOML (or, resuming without one, the recorded config), the dotted
    overrides, ENV and `--model`."""
    from looprl.trainer.config import load_config, parse_cli_overrides

    overrides = parse_cli_overrides(dotted)
    overrides["env.name"] = args.env
    if args.model is not None:
        overrides["model.name"] = args.model
    base = None
    recorded = Path(args.output) / "config.json" if args.output else None
    if args.resume and args.config is None and recorded is not None and recorded.is_file():
        base = json.loads(recorded.read_text(encoding="utf-8"))
    return load_config(args.config, overrides, base=base)


def bootstrap_job(cfg: Any, args: argparse.Namespace) -> Any:
    """Check the model, environment, engine and teacher; the `BootstrapJob` and its directory."""
    from looprl.cli.eval import check_model, load_env
    from looprl.sft.bootstrap import BootstrapJob
    from looprl.sft.student import ModelStudent, teacher_sampler

    check_model(cfg.model.name, "--model")
    check_engine(cfg)
    env = load_env(cfg.env.name, cfg.env.kwargs)
    section = cfg.bootstrap
    if section.teacher_base_url:
        check_teacher(section)
    output = output_dir(args, cfg)
    student = ModelStudent(
        section, cfg.engine, parser=cfg.model.parser,
        chat_template=cfg.model.chat_template, keep_reasoning=cfg.model.keep_reasoning,
        seed=cfg.trainer.seed, max_model_len=env.limits.max_context_tokens,
        concurrency=cfg.rollout.max_concurrent_groups, log=sft_log,
    )  # fmt: skip
    teacher = None
    if section.teacher_base_url:
        groups = cfg.rollout.max_concurrent_groups
        teacher = lambda: teacher_sampler(section, groups)  # noqa: E731
    output.mkdir(parents=True, exist_ok=True)
    write_text_atomically(output / "config.json", json.dumps(cfg.model_dump(mode="json"), indent=2))
    return BootstrapJob(
        env=env, section=section, student=student, start_model=cfg.model.name, output=output,
        group_size=cfg.rollout.rollouts_per_task, seed=cfg.trainer.seed,
        max_tokens=cfg.rollout.max_tokens, teacher=teacher, resume=args.resume,
        on_round=print_round,
    )  # fmt: skip


def check_engine(cfg: Any) -> None:
    """The engine must sample the weights each round trains: vLLM servers given by URL cannot."""
    if cfg.engine.kind == "vllm" and cfg.engine.base_urls:
        raise UsageError(
            "engine.base_urls: servers you started serve fixed weights, and each bootstrap round "
            "samples the model the round before trained",
            "leave engine.base_urls empty (looprl starts vLLM on each round's model), use "
            "--engine.kind torch, or make such a server the round-1 sampler with "
            "bootstrap.teacher_base_url",
        )


def check_teacher(section: Any) -> None:
    """The teacher server answers, takes the key and serves `teacher_model`."""
    import os

    from looprl.cli.eval import check_served_model, preflight

    var = section.teacher_api_key_var
    if var and var not in os.environ:
        raise UsageError(
            f"bootstrap.teacher_api_key_var {var}: no such environment variable is set",
            f"export {var}=YOUR_KEY first, or name the variable that holds the key",
        )
    url = section.teacher_base_url
    served = preflight(url, os.environ.get(var) if var else None)
    check_served_model(url, served, section.teacher_model)


def output_dir(args: argparse.Namespace, cfg: Any) -> Path:
    """`--output`, or a fresh `runs/bootstrap-ENV-MODEL-TIME`; refuse to mix two bootstraps."""
    if args.output is None:
        if args.resume:
            raise UsageError("--resume needs the bootstrap's directory", "pass --output DIR")
        model = Path(cfg.model.name).name
        env = Path(cfg.env.name).stem
        return Path("runs") / f"bootstrap-{env}-{model}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = Path(args.output)
    if args.resume and not (out / "config.json").is_file():
        raise UsageError(f"--resume: {out} holds no bootstrap", "pass the bootstrap's --output")
    if not args.resume and out.exists() and any(out.iterdir()):
        raise UsageError(
            f"--output {out} already holds files", "pass --resume to continue it or a new --output"
        )
    return out


def resume_argv(args: argparse.Namespace, output: Path) -> list[str]:
    """The arguments typed (the command first), with `--output DIR` and `--resume` added when
    missing."""
    argv = list(args.argv)
    if "--output" not in argv:
        argv += ["--output", str(output)]
    return argv + ([] if "--resume" in argv else ["--resume"])


def train_command(args: argparse.Namespace, dotted: list[str], model: str) -> list[str]:
    """`looprl train [CONFIG] --env.name ENV [the --section.field overrides] --model.name MODEL`:
    the same config, from the handed-over weights (`[bootstrap]` overrides left out)."""
    words = ["looprl", "train", *([args.config] if args.config else []), "--env.name", args.env]
    i = 0
    while i < len(dotted):
        item = dotted[i]
        pair = [item] if "=" in item else dotted[i : i + 2]
        key = item[2:].split("=", 1)[0].replace("-", "_")
        if not key.startswith("bootstrap.") and key != "model.name":
            words += pair
        i += len(pair)
    return [*words, "--model.name", model]


def sft_log(step: int, total: int, loss: float, seconds: float) -> None:
    """One console line per logged fine-tuning step."""
    console.print(f"  sft step {step}/{total}  loss {loss:.4f}  {seconds:.0f}s", highlight=False)


def print_start(job: Any) -> None:
    """The first line: what is bootstrapped, on what, how much per round, where."""
    s = job.section
    probe = f" ({s.probe_attempts} first, the rest if one succeeds)" if s.probe_attempts else ""
    console.print(
        f"[bold]looprl bootstrap[/bold] {job.env.name} · model {job.start_model} · "
        f"{s.tasks} tasks x {s.attempts} attempts{probe} per round at "
        f"T={s.attempt_temperature}, at most {s.max_rounds} rounds · GRPO groups of {job.group_size} → {job.output}",
        highlight=False,
    )


def print_round(record: Any) -> None:
    """One line per finished round."""
    s = record.stats
    then = f"fine-tuned {record.sft_steps} steps → {record.model}" if record.model else "stops"
    console.print(
        f"round {record.round}: pass@1 {s.pass_at_1:.3f} · pass@{s.k} {s.pass_at_k:.3f} · "
        f"signal {s.signal:.3f} · kept {kept_cell(record)} · {record.seconds:.0f} s · {then}",
        highlight=False,
    )


STOPS = {
    "handover": "{signal:.2f} of GRPO groups of {g} are expected to have reward variance "
    "(>= bootstrap.handover_signal {h}): RL has signal; handing over the model round {n} sampled",
    "stalled": "round {last}'s pass@1 did not beat the best round's by bootstrap.min_gain {gain} "
    "(nor, when rationalising, its hinted success rate the best earlier round's); "
    "handing over the model the best round sampled (round {n})",
    "max_rounds": "bootstrap.max_rounds {rounds} reached; handing over the model the best round "
    "sampled (round {n}); raise max_rounds into a new --output to go further",
    "no_successes": "round {last} kept no new success (reward >= {thr}){hinted}: nothing to "
    "fine-tune on — raise bootstrap.attempts or bootstrap.attempt_temperature, start from easier "
    "tasks (an easier slice through --env.kwargs, or a curriculum), {rationalise}, or let a "
    "stronger model sample round 1 (bootstrap.teacher_base_url)",
}
"""Why the bootstrap stopped, by `Stop`, each with what comes next."""


def sampled_label(record: Any) -> str:
    """What made a round's attempts: the teacher, the starting model, or round n-1's model."""
    if record.by == "teacher":
        return f"teacher {record.sampler}"
    return Path(record.sampled_model).name if record.round == 1 else f"round_{record.round - 1}"


def print_report(outcome: Any, cfg: Any) -> None:
    """The table of rounds, why it stopped, and the model handed over."""
    table = Table(title="bootstrap rounds", header_style="bold")
    ks = {r.stats.k for r in outcome.records}  # a round that sampled only its probe has fewer
    mixed = len(ks) > 1
    k = "k" if mixed else str(next(iter(ks)))
    heads = ["round", "sampled", "pass@1", f"pass@{k}", "solved", "signal",
             "successes", "kept", "SFT steps", "tokens", "seconds"]  # fmt: skip
    for h in heads:
        table.add_column(h, justify="left" if h == "sampled" else "right")
    for r in outcome.records:
        s = r.stats
        table.add_row(
            str(r.round), sampled_label(r), f"{s.pass_at_1:.3f}",
            f"{s.pass_at_k:.3f}" + (f" (k={s.k})" if mixed else ""),
            f"{s.tasks_solved}/{s.tasks}", f"{s.signal:.3f}", f"{s.successes}/{s.attempts}",
            kept_cell(r), str(r.sft_steps), str(r.tokens), f"{r.seconds:.0f}",
        )  # fmt: skip
    console.print(table)
    console.print(
        f"sampled: the model that made the attempts (round_N: round N's) · pass@1, pass@{k}: "
        f"unbiased estimates from each task's {k} attempts"
        + (" (fewer in a round whose probe found no success)" if mixed else "")
        + " · solved: tasks with a success · "
        f"signal: expected fraction of GRPO groups of {cfg.rollout.rollouts_per_task} with "
        "non-zero reward variance",
        highlight=False,
    )
    b, last = cfg.bootstrap, outcome.records[-1]
    text = STOPS[outcome.stop].format(
        signal=last.stats.signal, g=cfg.rollout.rollouts_per_task, h=b.handover_signal,
        n=outcome.handover_round, last=last.round, gain=b.min_gain, rounds=b.max_rounds,
        thr=b.success_threshold,
        hinted=f", nor any of its {last.hinted_attempts} hinted attempts"
        if last.hinted_attempts else "",
        rationalise="give a stronger hint (more of the way, or the answer format in a note: "
        "looprl.then_note)" if b.rationalize
        else "rationalise with the environment's hint (bootstrap.rationalize)",
    )  # fmt: skip
    style = "yellow" if outcome.stop == "no_successes" else "bold"
    console.print(f"[{style}]stopped:[/] {text}", highlight=False, soft_wrap=True)


def kept_cell(record: Any) -> str:
    """Successes a round kept: `12`, or `12 + 5 hinted (6/40)` with rationalisation (the hinted
    attempts that succeeded, of those sampled)."""
    if not record.hinted_attempts:
        return str(record.kept)
    return (
        f"{record.kept} + {record.hinted} hinted "
        f"({record.hinted_successes}/{record.hinted_attempts})"
    )
