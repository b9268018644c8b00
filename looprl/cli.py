"""The `looprl` command line: eval, train, sft, view, init."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from looprl.console import console


def parse_overrides(items: list[str], *prefixes: str) -> dict[str, dict[str, Any]]:
    """Turn `--prefix.key value` pairs into one dict per prefix (values parsed as JSON when possible)."""
    from looprl.trainer.config import ConfigError, parse_cli_overrides

    try:
        parsed = parse_cli_overrides(items)
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    out: dict[str, dict[str, Any]] = {prefix: {} for prefix in prefixes}
    for key, value in parsed.items():
        prefix, _, rest = key.partition(".")
        if prefix not in out:
            shapes = " or ".join(f"--{p}.KEY VALUE" for p in prefixes)
            raise SystemExit(f"error: unrecognized argument --{key}; options look like {shapes}")
        out[prefix][rest] = value
    return out


def _eval_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluate a model on an environment")
    p.add_argument("env", help="environment name (calculator), module path, or .py file")
    p.add_argument(
        "--model",
        default="tiny",
        help="tiny, smollm2-135m, a local HF directory, or a served model name",
    )
    p.add_argument(
        "--base-url",
        default=None,
        help="OpenAI-compatible server URL (then --model names the served model)",
    )
    p.add_argument("--api-key", default=None)
    p.add_argument("-n", "--num-tasks", type=int, default=50)
    p.add_argument(
        "-r", "--rollouts", type=int, default=4, help="rollouts per task (pass@k up to this k)"
    )
    p.add_argument("--split", default="eval", choices=["eval", "train"])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="max new tokens per turn (default: the environment's)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pass-threshold", type=float, default=1.0, help="reward counted as solved for pass@k"
    )
    p.add_argument("--concurrency", type=int, default=64, help="task groups run at once")
    p.add_argument(
        "--output", default=None, help="results directory (default runs/eval-ENV-MODEL-TIME)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted evaluation in --output (or the latest)",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `looprl` command."""
    parser = argparse.ArgumentParser(
        prog="looprl", description="Train and evaluate agentic reasoners."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _eval_parser(sub)
    _train_parser(sub)
    _sft_parser(sub)
    _view_parser(sub)
    _init_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    plain, extra = split_dotted(argv)
    args = parser.parse_args(plain)
    args.argv = argv  # as given, for a command that relaunches itself (train --nproc)
    if args.command == "eval":
        overrides = parse_overrides(extra, "env", "engine")
        return run_eval_command(args, overrides["env"], overrides["engine"])
    if args.command in ("train", "sft"):
        return int(args.func(args, extra) or 0)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return int(args.func(args) or 0)


def split_dotted(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate `--section.field VALUE` overrides (and `--a.b=VALUE`) from ordinary arguments."""
    plain: list[str] = []
    dotted: list[str] = []
    i = 0
    while i < len(argv):
        item = argv[i]
        if item.startswith("--") and "." in item.split("=", 1)[0]:
            if "=" in item or i + 1 >= len(argv):
                dotted.append(item)
                i += 1
            else:
                dotted += [item, argv[i + 1]]
                i += 2
            continue
        plain.append(item)
        i += 1
    return plain, dotted


def _default_output(args: argparse.Namespace) -> Path:
    model = Path(args.model).name.replace("/", "_")
    env = Path(args.env).stem
    if args.resume:
        candidates = sorted(Path("runs").glob(f"eval-{env}-{model}-*"))
        if not candidates:
            raise SystemExit(
                f"error: --resume found no runs/eval-{env}-{model}-* directory; pass --output DIR"
            )
        return candidates[-1]
    return Path("runs") / f"eval-{env}-{model}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_eval_command(
    args: argparse.Namespace, env_kwargs: dict[str, Any], engine: dict[str, Any] | None = None
) -> int:
    """`looprl eval`: run, stream results, print the summary, write metadata; 1 if it failed."""
    from pydantic import ValidationError

    from looprl.engines.config import EngineSection
    from looprl.envs.registry import load_environment
    from looprl.run_eval import EvalConfig, evaluate_and_report

    try:
        engine_cfg = EngineSection.model_validate(engine or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise SystemExit(f"error: --engine.{loc}: {err['msg']}") from None

    if args.num_tasks < 1 or args.rollouts < 1:
        raise SystemExit("error: -n and -r must be >= 1")
    env = load_environment(args.env, **env_kwargs)
    out = Path(args.output) if args.output else _default_output(args)
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise SystemExit(
            f"error: {out} already holds results; pass --resume to continue it or choose another --output"
        )
    cfg = EvalConfig(
        env=args.env, output=out, env_kwargs=env_kwargs, model=args.model, base_url=args.base_url,
        api_key=args.api_key, num_tasks=args.num_tasks, rollouts=args.rollouts, split=args.split,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        max_tokens=args.max_tokens, seed=args.seed, pass_threshold=args.pass_threshold,
        concurrency=args.concurrency, resume=args.resume, engine=engine_cfg,
    )  # fmt: skip
    outcome = evaluate_and_report(cfg, env)
    return 1 if outcome.status == "failed" else 0


def _train_parser(sub: Any) -> None:
    p = sub.add_parser(
        "train", help="RL-train a model from a TOML config (overrides: --section.field VALUE)"
    )
    p.add_argument(
        "config", nargs="?", default=None, help="TOML config file (defaults when omitted)"
    )
    p.add_argument(
        "--resume", action="store_true", help="continue from the run directory's latest checkpoint"
    )
    p.add_argument(
        "--run-dir", default=None, help="run directory (default runs/NAME from the config)"
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="train with N processes (FSDP2): relaunches this command under torchrun",
    )
    p.set_defaults(func=run_train_command)


def torchrun_command(argv: list[str], nproc: int) -> list[str]:
    """`python -m torch.distributed.run --nproc-per-node N -m looprl.cli ARGV` (ARGV without --nproc)."""
    rest, i = [], 0
    while i < len(argv):
        if argv[i] == "--nproc":
            i += 2
            continue
        if not argv[i].startswith("--nproc="):
            rest.append(argv[i])
        i += 1
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "-m", "looprl.cli", *rest]  # fmt: skip


def run_train_command(args: argparse.Namespace, extra: list[str]) -> int:
    """`looprl train`: load and validate the config, then train (under torchrun with --nproc N)."""
    from looprl.trainer.config import ConfigError, load_config, parse_cli_overrides

    if args.nproc < 1:
        raise SystemExit("error: --nproc must be >= 1")
    try:
        cfg = load_config(args.config, parse_cli_overrides(extra))
        if args.nproc > 1:  # the config is valid: each rank re-reads it under torchrun
            import subprocess

            return subprocess.call(torchrun_command(args.argv, args.nproc))
        from looprl.trainer.trainer import Trainer

        run_dir = Path(args.run_dir) if args.run_dir else None
        if args.resume and run_dir is None:
            if cfg.run.name is None:
                raise ConfigError("--resume needs --run-dir DIR or run.name in the config")
            run_dir = Path(cfg.run.output_dir) / cfg.run.name
        trainer = Trainer(cfg, run_dir=run_dir, resume=args.resume)
    except ConfigError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    trainer.run()
    return 0


def _sft_parser(sub: Any) -> None:
    p = sub.add_parser("sft", help="supervised warm-start from a JSONL of conversations")
    p.add_argument(
        "--data", required=True, help='JSONL with {"messages": [...], "tools": [...]} per line'
    )
    p.add_argument("--model", default="tiny", help="tiny, smollm2-135m or a local HF directory")
    p.add_argument(
        "--output", required=True, help="directory for the fine-tuned Hugging Face model"
    )
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="bound memory: padded tokens per forward pass (e.g. 2048), gradients accumulated "
        "and the vocabulary projection on trained tokens only; default: one full-logits pass",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_sft_command)


def run_sft_command(args: argparse.Namespace, extra: list[str]) -> int:
    """`looprl sft`: encode conversations with the model's template, train, export."""
    from looprl.models.loading import load_model
    from looprl.rendering.renderer import Renderer
    from looprl.sft import examples_from_rows, read_conversations, sft_train
    from looprl.trainer.checkpoint import export_hf
    from looprl.trainer.setup import seed_everything

    if extra:
        raise SystemExit(f"error: unrecognized arguments: {' '.join(extra)}")
    rows = read_conversations(Path(args.data))
    seed_everything(args.seed)
    model, tokenizer = load_model(args.model)
    examples = examples_from_rows(
        lambda tools: Renderer(tokenizer, tools), rows, tokenizer.eos_token
    )
    console.print(
        f"[bold]looprl sft[/bold] {len(examples)} conversations · {sum(map(lambda e: sum(e.mask), examples))} trained tokens"
    )

    def log(step: int, total: int, loss: float, seconds: float) -> None:
        console.print(f"step {step}/{total}  loss {loss:.4f}  {seconds:.0f}s")

    sft_train(
        model,
        examples,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        micro_batch_tokens=args.micro_batch_tokens,
        log=log,
    )
    export_hf(model, tokenizer, Path(args.output))
    console.print(f"saved {args.output}")
    return 0


def _view_parser(sub: Any) -> None:
    p = sub.add_parser("view", help="open the local web viewer on runs or eval results")
    p.add_argument(
        "paths", nargs="+", help="run directories, folders of runs, or eval result directories"
    )
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--open", action="store_true", help="open a browser tab")

    def run(args: argparse.Namespace) -> int:
        from looprl.viewer import main_args

        argv = [*args.paths, "--port", str(args.port), "--host", args.host] + (
            ["--open"] if args.open else []
        )
        return main_args(argv)

    p.set_defaults(func=run)


def _init_parser(sub: Any) -> None:
    p = sub.add_parser(
        "init", help="scaffold an environment package (module, pyproject, README, test)"
    )
    p.add_argument("name", help="package name, e.g. my_env")
    p.add_argument("--dest", default=".", help="parent directory (default: here)")

    def run(args: argparse.Namespace) -> int:
        from looprl.scaffold import scaffold

        try:
            path = scaffold(args.name, Path(args.dest))
        except (ValueError, FileExistsError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 2
        module = next(iter(sorted(path.glob("*.py"))), path)
        console.print(
            f"created {path}\ntry: looprl eval {module} --model tiny -n 4 -r 2   (or pip install -e {path})"
        )
        return 0

    p.set_defaults(func=run)


if __name__ == "__main__":
    sys.exit(main())
