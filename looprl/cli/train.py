"""`looprl train`, `looprl sft` and `looprl config show`: the training commands and their fields.

`train` reads `TrainConfig` (TOML plus `--section.field VALUE`); its `--help`, `config show` and
`docs/config.md` list every field from the same pydantic models. `sft` reads `SFTConfig` from its
flags. Both check the model name and the data before loading anything.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from looprl.cli.fields import (
    UsageError,
    add_model_flags,
    config_from_args,
    fields_markdown,
    fields_text,
    usage_error,
)
from looprl.console import console

CONFIG_DOC_HEAD = """\
# Training configuration reference

Every field of `looprl train`'s configuration, generated from the pydantic models in
`looprl/trainer/config.py` (and `looprl/engines/config.py` for `[engine]`). Set a field in the
TOML file under its section (`[optim]` then `lr = 1e-5`) or on the command line
(`--optim.lr 1e-5`); the command line wins. `looprl train --help` and `looprl config show
[CONFIG]` print the same list; an unknown field is refused with the nearest name.
Regenerate this file with `looprl config show --markdown > docs/config.md`.

"""


class SFTConfig(BaseModel):
    """What `looprl sft` runs: its flags, typed and validated (see `looprl sft --help`)."""

    model_config = ConfigDict(extra="forbid")

    data: Path = Field(
        description='JSONL, one conversation per line: {"messages": [...], "tools": [...]} '
        "(OpenAI message format; what looprl eval --save-sft writes)"
    )
    output: Path = Field(description="directory for the fine-tuned Hugging Face model")
    model: str = Field("tiny", description="tiny, smollm2-135m or a local HF directory")
    epochs: float = Field(1.0, gt=0, description="passes over the data (fractions allowed)")
    lr: float = Field(1e-3, gt=0, description="AdamW peak learning rate (cosine schedule)")
    batch_size: int = Field(16, ge=1, description="conversations per optimizer step")
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="bound memory: padded tokens per forward pass (e.g. 2048), gradients "
        "accumulated and the vocabulary projection on trained tokens only; default: one "
        "full-logits pass, or 2048 for a batch whose logits pass 512 MiB (long conversations)",
    )
    seed: int = Field(0, description="seed of shuffling and initialisation")
    overwrite: bool = Field(
        False,
        description="replace an existing --output model (the new one is written beside it and "
        "swapped in at the end; until then the old one stays)",
    )


def register(sub: Any) -> None:
    """Add `looprl train`, `looprl sft` and `looprl config` to the command line."""
    _train_parser(sub)
    _sft_parser(sub)
    _config_parser(sub)


def _train_parser(sub: Any) -> None:
    from looprl.trainer.config import TrainConfig

    p = sub.add_parser(
        "train",
        help="RL-train a model from a TOML config (overrides: --section.field VALUE)",
        description="RL-train a model. Every field below can be set in the TOML config "
        "([section] then field = value) or on the command line (--section.field VALUE).",
        epilog="config fields:\n" + fields_text(TrainConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "config", nargs="?", default=None, help="TOML config file (defaults when omitted)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the run directory's latest checkpoint (with no config file: with "
        "the config the run recorded in its config.json)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with --resume: continue even where the config differs from the run's config.json "
        "in a field that changes what the run learns (docs/config.md, Resuming a run)",
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
    """`python -m torch.distributed.run --nproc-per-node N -m looprl ARGV` (ARGV without --nproc)."""
    rest, i = [], 0
    while i < len(argv):
        if argv[i] == "--nproc":
            i += 2
            continue
        if not argv[i].startswith("--nproc="):
            rest.append(argv[i])
        i += 1
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "-m", "looprl", *rest]  # fmt: skip


def train_config(args: argparse.Namespace, extra: list[str]) -> tuple[Any, Path | None]:
    """The run's config (its paths absolute) and directory. `--resume --run-dir DIR` without a
    TOML file continues with the config the run recorded (overrides still apply), not with the
    defaults; a resumed config that changes what the run learns is refused unless `--force`, and
    a directory a live trainer holds is refused first."""
    from looprl.trainer.config import ConfigError, load_config, parse_cli_overrides, recorded_config
    from looprl.trainer.run_config import absolute_paths
    from looprl.trainer.run_lock import check_run_free

    run_dir = Path(args.run_dir) if args.run_dir else None
    if run_dir is not None:  # a live trainer there: its one line before any other complaint
        check_run_free(run_dir)
    base = recorded_config(run_dir) if args.resume and run_dir and args.config is None else None
    cfg = absolute_paths(load_config(args.config, parse_cli_overrides(extra), base=base))
    if args.resume and run_dir is None:
        if cfg.run.name is None:
            raise ConfigError("--resume needs a run directory; pass --run-dir DIR or set run.name")
        run_dir = Path(cfg.run.output_dir) / cfg.run.name
    if args.resume and run_dir is not None and not args.force:
        check_resume_config(run_dir, cfg)
    return cfg, run_dir


def check_resume_config(run_dir: Path, cfg: Any) -> None:
    """Refuse, naming each field, a config that differs from the one `run_dir` recorded in a
    field that changes what the run learns (a run with no `config.json` yet passes)."""
    from looprl.trainer.config import recorded_config
    from looprl.trainer.run_config import resume_changes

    if not (run_dir / "config.json").is_file():
        return
    changes = resume_changes(recorded_config(run_dir), cfg)
    if changes:
        raise UsageError(
            f"--resume: the config differs from the one {run_dir} was trained with: "
            + "; ".join(changes),
            "drop the changed settings to continue as recorded, or pass --force to continue with "
            "them (docs/config.md lists what a resume may change)",
        )


def run_train_command(args: argparse.Namespace, extra: list[str]) -> int:
    """`looprl train`: load and validate the config and the model name, then train."""
    from looprl.cli.eval import check_model

    if args.nproc < 1:
        raise UsageError(f"--nproc {args.nproc} is below 1", "pass --nproc 1 or more")
    if args.force and not args.resume:
        raise UsageError("--force without --resume", "--force accepts a changed config on resume")
    cfg, run_dir = train_config(args, extra)
    check_model(cfg.model.name, "--model.name")
    if args.nproc > 1:  # the config is valid: each rank re-reads it under torchrun
        return _launch(args, cfg, run_dir)
    from looprl.trainer.distributed import torchrun_world_size
    from looprl.trainer.trainer import Trainer

    argv, world = args.argv, torchrun_world_size()
    if world > 1:  # a rank: it ends when torchrun's agent does; a resume needs --nproc again
        from looprl.cli.torchrun import stay_with_launcher

        stay_with_launcher()
        argv = [*argv, "--nproc", str(world)]

    trainer = Trainer(cfg, run_dir=run_dir, resume=args.resume)
    try:
        trainer.run()
    except KeyboardInterrupt:
        from looprl.cli.interrupts import train_interrupted

        raise train_interrupted(argv, trainer.run_dir) from None
    return 0


def _launch(args: argparse.Namespace, cfg: Any, run_dir: Path | None) -> int:
    """Start torchrun tied to this process (`looprl.cli.torchrun`), once the run directory is
    free and, on resume, its checkpoint was written by `--nproc` processes."""
    from looprl.cli.torchrun import launch
    from looprl.trainer.run_lock import check_run_free

    target = run_dir or (Path(cfg.run.output_dir) / cfg.run.name if cfg.run.name else None)
    if target is not None:
        check_run_free(target)  # a live trainer there: one line, no launch
    if args.resume and run_dir is not None:  # a checkpoint of another N: one line, no launch
        from looprl.trainer.checkpoint.sharded import check_resume_world

        check_resume_world(run_dir, args.nproc)
    return launch(torchrun_command(args.argv, args.nproc))


def _sft_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sft",
        help="supervised warm-start from a JSONL of conversations",
        description="Supervised fine-tuning on the assistant turns of conversations (JSONL); "
        "write such a file with looprl eval ENV --policy MODULE:FN --save-sft FILE.",
    )
    add_model_flags(p, SFTConfig, short={"model": "-m"})
    p.set_defaults(func=run_sft_command, dotted=False)


def run_sft_command(args: argparse.Namespace, dotted: list[str]) -> int:
    """`looprl sft`: check the flags, data and model name, encode, train, export."""
    from looprl.cli.eval import check_model

    values = {k: v for k, v in vars(args).items() if k in SFTConfig.model_fields}
    cfg: SFTConfig = config_from_args(SFTConfig, values)
    from looprl.sft.train import read_conversations

    try:
        rows = read_conversations(cfg.data)
    except ValueError as exc:
        raise usage_error(str(exc), "fix the line (see looprl sft --help)") from None
    check_model(cfg.model, "--model")
    check_sft_output(cfg.output, cfg.overwrite)
    try:
        _sft(cfg, rows)
    except KeyboardInterrupt:
        from looprl.cli.interrupts import sft_interrupted

        raise sft_interrupted(cfg.output) from None
    return 0


def check_sft_output(output: Path, overwrite: bool) -> None:
    """Refuse an existing `--output` unless `--overwrite`, and even then anything but a model
    directory (or an empty one): a mistyped path must not replace a run or a folder of files."""
    if not output.exists():
        return
    if not overwrite:
        raise UsageError(
            f"--output {output} already exists",
            "choose another --output, or pass --overwrite to replace the model there",
        )
    if not _replaceable(output):
        raise UsageError(
            f"--output {output} is not a model directory, and --overwrite replaces only a model",
            "choose another --output (a new directory)",
        )


def _replaceable(path: Path) -> bool:
    """True for an empty directory or a Hugging Face model directory (config, weights, tokens)."""
    from looprl.models.loading import check_model_dir

    if not path.is_dir() or path.is_symlink():
        return False
    if not any(path.iterdir()):
        return True
    try:
        check_model_dir(path)
    except ValueError:
        return False
    return True


def _sft(cfg: SFTConfig, rows: list[dict[str, Any]]) -> None:
    from looprl.sft.train import sft_model

    def start(conversations: int, tokens: int) -> None:
        console.print(
            f"[bold]looprl sft[/bold] {conversations} conversations · {tokens} trained tokens"
        )

    def log(step: int, total: int, loss: float, seconds: float) -> None:
        console.print(f"step {step}/{total}  loss {loss:.4f}  {seconds:.0f}s")

    sft_model(
        cfg.model, rows, cfg.output, epochs=cfg.epochs, lr=cfg.lr, batch_size=cfg.batch_size,
        seed=cfg.seed, micro_batch_tokens=cfg.micro_batch_tokens, log=log, on_start=start,
    )  # fmt: skip
    console.print(f"saved {cfg.output}")


def _config_parser(sub: Any) -> None:
    p = sub.add_parser("config", help="show the training config's fields (and a file's values)")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser(
        "show", help="list every field with its type, default and description"
    )
    show.add_argument("config", nargs="?", default=None, help="a TOML config: show its values too")
    show.add_argument("--markdown", action="store_true", help="print docs/config.md instead")
    p.set_defaults(func=run_config_command)


def run_config_command(args: argparse.Namespace, extra: list[str]) -> int:
    """`looprl config show [CONFIG] [--section.field VALUE ...]`: the fields, with values if given."""
    from looprl.trainer.config import TrainConfig, load_config, parse_cli_overrides

    if args.markdown:
        print(config_markdown(), end="")
        return 0
    values = None
    if args.config is not None or extra:
        values = load_config(args.config, parse_cli_overrides(extra))
    print(fields_text(TrainConfig, values))
    return 0


def config_markdown() -> str:
    """docs/config.md: the head above and one table per section of `TrainConfig`."""
    from looprl.trainer.config import TrainConfig
    from looprl.trainer.run_config import resume_markdown

    return CONFIG_DOC_HEAD + resume_markdown() + fields_markdown(TrainConfig)
