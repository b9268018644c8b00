"""The `looprl` command line: eval, train, sft, bootstrap, config, env, probe, view, init.

Each command lives in its own module (`cli_eval`, `cli_train`, `cli_env`) and registers itself
here. A user mistake anywhere is a `UsageError` (or a `ConfigError`): `main` prints one line,
`error: <what> — <the fix>`, on stderr and returns 2; `LOOPRL_DEBUG=1` adds the traceback.
A disk that takes no more data (full, over quota, read-only) is one line naming the file and
the fix, exit 1 (`looprl.files.writing` names the path at each writer). Ctrl-C prints one line,
`interrupted: <what was kept> — <how to resume>` (an `Interrupted` raised by the command,
`looprl.cli.interrupts`) or just `interrupted`, and returns 130; a reader
of stdout that goes away (`| head`) ends the command quietly with 0. Anything else is a bug and
keeps its traceback (exit 1). A command's function takes `(args, dotted)`: `dotted` holds its
`--section.field VALUE` options (a command registered with `dotted=False` refuses them).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any, NoReturn

from looprl.cli.eval import parse_overrides
from looprl.cli.fields import Interrupted, UsageError, did_you_mean, usage_error
from looprl.files import write_fault_line

__all__ = ["main", "parse_overrides", "split_dotted"]


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one-line UsageErrors with a `did you mean` hint."""

    def error(self, message: str) -> NoReturn:
        """Raise the argparse complaint as a UsageError (argparse would print usage and exit)."""
        raise UsageError(message, f"see {self.prog} --help")

    def flags(self) -> list[str]:
        """Every option string this parser takes (`--num-tasks`, `-n`, ...)."""
        return [s for a in self._actions for s in a.option_strings]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("looprl")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> tuple[Parser, dict[str, Parser]]:
    """The `looprl` parser and each command's own parser, by name."""
    from looprl.cli import bootstrap as cli_bootstrap
    from looprl.cli import env as cli_env
    from looprl.cli import eval as cli_eval
    from looprl.cli import train as cli_train
    from looprl.probe import command as probe_command

    parser = Parser(prog="looprl", description="Train and evaluate agentic reasoners.")
    parser.add_argument("--version", action="version", version=f"looprl {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cli_eval.register(sub)
    cli_train.register(sub)
    cli_bootstrap.register(sub)
    cli_env.register(sub)
    probe_command.register(sub)
    _view_parser(sub)
    return parser, dict(sub.choices)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `looprl` command; returns the exit code (2 for a user mistake)."""
    from looprl.tools.hung import ToolsHung
    from looprl.trainer.config import ConfigError

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _dispatch(argv)
        sys.stdout.flush()  # a reader gone (`| head`) shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        return _reader_gone()
    except KeyboardInterrupt as exc:  # Ctrl-C: one line, with how to resume when there is a way
        return _interrupted(exc)
    except ToolsHung as exc:  # the run stopped by design: one line, finished work is kept
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (UsageError, ConfigError) as exc:
        if os.environ.get("LOOPRL_DEBUG"):
            traceback.print_exc()
        if not isinstance(exc, UsageError):
            exc = usage_error(str(exc), "see looprl config show for every field")
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a disk that takes no more data: one line naming the file
        return _write_fault(exc, argv)
    except SystemExit as exc:  # `raise SystemExit("error: ...")`: a one-line refusal, exit 2
        if not isinstance(exc.code, str):
            raise
        print(exc.code if exc.code.startswith("error:") else f"error: {exc.code}", file=sys.stderr)
        return 2


def _interrupted(exc: KeyboardInterrupt) -> int:
    """Ctrl-C: print one line (how to resume, when there is a way); exit code 130."""
    if os.environ.get("LOOPRL_DEBUG"):
        traceback.print_exc()
    print(f"interrupted: {exc}" if isinstance(exc, Interrupted) else "interrupted", file=sys.stderr)
    return 130


def _write_fault(exc: OSError, argv: list[str]) -> int:
    """A full or read-only disk: one line naming the file, exit 1; any other OSError re-raised."""
    line = write_fault_line(exc, _go_on(argv))
    if line is None:
        raise exc  # anything else is a bug, with its traceback
    if os.environ.get("LOOPRL_DEBUG"):
        traceback.print_exc()
    print(line, file=sys.stderr)
    return 1


def _go_on(argv: list[str]) -> str:
    """How to go on after a full disk: `looprl eval` and `looprl train` resume, the rest rerun."""
    command = next((a for a in argv if not a.startswith("-")), "")
    return "rerun with --resume" if command in ("eval", "train", "bootstrap") else "rerun"


def _reader_gone() -> int:
    """The reader of stdout left (`looprl config show | head`): stop quietly, exit 0, as ruff does.

    What is still buffered for stdout goes to /dev/null, so the flush at interpreter exit does
    not fail again.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


def _dispatch(argv: list[str]) -> int:
    parser, commands = build_parser()
    plain, dotted = split_dotted(argv)
    _check_command(plain, commands)
    args, unknown = parser.parse_known_args(plain)
    if unknown:
        command = commands[args.command]
        flag = next((u for u in unknown if u.startswith("-")), unknown[0])
        hint = did_you_mean(flag.split("=")[0], command.flags()) if flag.startswith("-") else ""
        if args.command in ("train", "config") and flag.startswith("--"):
            from looprl.trainer.config import foreign_name_hint  # learning_rate -> optim.lr

            hint = foreign_name_hint(flag) or hint
        raise UsageError(
            f"unrecognized argument {flag} for looprl {args.command}",
            hint or f"see looprl {args.command} --help",
        )
    args.argv = argv  # as given, for a command that relaunches itself (train --nproc)
    if dotted and not getattr(args, "dotted", True):
        raise UsageError(
            f"looprl {args.command} takes no --section.field options (got {dotted[0]})",
            f"see looprl {args.command} --help",
        )
    return int(args.func(args, dotted) or 0)


def _check_command(plain: list[str], commands: dict[str, Parser]) -> None:
    """An unknown command (or an option before any command) is a one-line error with the fix."""
    if plain and plain[0].startswith("-") and plain[0] not in ("-h", "--help", "--version"):
        hint = did_you_mean(plain[0], ["--help", "--version"])
        raise UsageError(
            f"unrecognized argument {plain[0]}",
            hint or "options follow the command: looprl COMMAND [OPTIONS] (see looprl --help)",
        )
    first = next((a for a in plain if not a.startswith("-")), None)
    if first is not None and first not in commands and not plain[0].startswith("-"):
        hint = did_you_mean(first, list(commands))
        raise UsageError(f"unknown command {first!r}", hint or f"choose one of {sorted(commands)}")


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


def _view_parser(sub: Any) -> None:
    p = sub.add_parser("view", help="open the local web viewer on runs or eval results")
    p.add_argument(
        "paths", nargs="+", help="run directories, folders of runs, or eval result directories"
    )
    p.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--open", action="store_true", help="open a browser tab")
    p.add_argument(
        "--tokenizer", help="the token view's tokenizer: a model directory or name (default: "
        "the run's own, or one its config names inside the directories viewed)",
    )  # fmt: skip

    def run(args: argparse.Namespace, dotted: list[str]) -> int:
        from looprl.viewer import main_args

        argv = [*args.paths, "--port", str(args.port), "--host", args.host] + (
            ["--open"] if args.open else []
        )
        argv += ["--tokenizer", args.tokenizer] if args.tokenizer else []
        return main_args(argv)

    p.set_defaults(func=run, dotted=False)


if __name__ == "__main__":
    sys.exit(main())
