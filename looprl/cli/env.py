"""`looprl env list`, `looprl env check` and `looprl init`: the environments there are, whether one
is sound (`looprl.probe.check`), and a new one scaffolded."""

from __future__ import annotations

import argparse
import ast
import importlib.util
from pathlib import Path
from typing import Any

from looprl.console import console
from looprl.probe import check


def register(sub: Any) -> None:
    """Add `looprl env` and `looprl init` to the command line."""
    p = sub.add_parser("env", help="list the environments looprl can load by name")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="bundled and installed environments, one line each")
    check.register(actions)  # `looprl env check ENV` (looprl/probe/check.py)
    p.set_defaults(func=run_env_command, dotted=False)
    _init_parser(sub)


def describe(target: str) -> str:
    """The first docstring line of a module, or of `module:function`'s function, read from the
    source without importing it."""
    module, _, function = target.partition(":")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return "(no description)"
    node: Any = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    if function:
        found = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == function]
        node = found[0] if found else None
    doc = ast.get_docstring(node) if node is not None else None
    return doc.strip().splitlines()[0] if doc else "(no description)"


ENV_LIST_COLUMNS = ("name", "version", "source", "description")
"""The columns of `looprl env list`, one row per `looprl.envs.registry.Registered`."""


def environment_lines() -> list[tuple[str, str, str, str]]:
    """(name, version, source, one-line description) of every bundled and installed
    environment, by name."""
    from looprl.envs.registry import registered_environments

    return [
        (row.name, row.version, row.source, describe(row.target))
        for row in registered_environments()
    ]


def clashes() -> list[str]:
    """The one-line error of each name that two sources register (loading it is refused)."""
    from looprl.envs.registry import clash, registered_environments

    rows = registered_environments()
    names = sorted({row.name for row in rows})
    groups = [[row for row in rows if row.name == name] for name in names]
    return [clash(group[0].name, group) for group in groups if len(group) > 1]


def run_env_command(args: argparse.Namespace, dotted: list[str]) -> int:
    """`looprl env list`: a table of the environments by name, then what else a name may be."""
    rows = [ENV_LIST_COLUMNS, *environment_lines()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(ENV_LIST_COLUMNS) - 1)]
    for row in rows:
        padded = [f"{cell:<{width}}" for cell, width in zip(row[:-1], widths, strict=True)]
        print("  ".join([*padded, row[-1]]))
    for line in clashes():
        print(f"refused: {line}")
    print(
        "\nalso: a .py file or a folder exposing load_environment(**kwargs), or a module path "
        "(my_pkg.my_env)"
    )
    return 0


def _init_parser(sub: Any) -> None:
    p = sub.add_parser(
        "init", help="scaffold an environment package (module, pyproject, README, test)"
    )
    p.add_argument("name", help="package name, e.g. my_env")
    p.add_argument("--dest", default=".", help="parent directory (default: here)")
    p.set_defaults(func=run_init_command, dotted=False)


def run_init_command(args: argparse.Namespace, dotted: list[str]) -> int:
    """`looprl init NAME`: write the package; a bad name or an existing one is a UsageError."""
    from looprl.cli.fields import usage_error
    from looprl.cli.scaffold import scaffold

    try:
        path = scaffold(args.name, Path(args.dest))
    except (ValueError, FileExistsError) as exc:
        raise usage_error(str(exc), "choose another name or --dest") from None
    module = next(iter(sorted(path.glob("*.py"))), path)
    console.print(
        f"created {path}\ntry: looprl eval {module} --model tiny -n 4 -r 2   (or pip install -e {path})"
    )
    return 0
