"""Load environments by name (`calculator`), installed package, `.py` file, folder or module path.

A name resolves in this order, the first that matches:

1. `verifiers:MODULE`, `openenv:MODULE[:CLASS]`: a foreign environment (`looprl.envs.foreign`);
2. a bundled environment: a row of `BUILTIN`;
3. an installed package's entry point in the group `looprl.environments` (its pyproject:
   `[project.entry-points."looprl.environments"]` with `NAME = "module:load_environment"`);
4. a path: a `.py` file, or a folder that exists (imported as its main file,
   `looprl.files.FOLDER_MAIN_FILES`), which imports the files beside it while it loads;
5. a module path (`my_pkg.my_env`, or an installed package's module with `load_environment`).

A name that two of 2 and 3 register (a package and a bundled environment, or two packages) is
refused, naming the packages and the fix. `registered_environments` lists 2 and 3 with their
packages and versions (`looprl env list` prints them).

Two tables name what the registry can load, each row a `module` or `module:object` imported only
when a configuration asks for it: `BUILTIN`, the bundled environments, and `OPTIONS`, arguments
every environment takes that the registry applies beside it instead of passing them to its
`load_environment` (`judge`: an LLM judge added to the rubric, `looprl.judge.config`).
"""

from __future__ import annotations

import functools
import importlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import Any

from looprl.envs.base import Environment
from looprl.envs.foreign import is_foreign, load_foreign
from looprl.files import import_module_or_file

BUILTIN = {
    "calculator": "looprl.envs.calculator",
    "calculator_text": "looprl.envs.calculator_text",
    "search_qa": "looprl.envs.search_qa",
    "wordle": "looprl.envs.wordle",
    "reasoning_gym": "looprl.envs.reasoning_gym_env",
    "mixture": "looprl.envs.mixture",
    "python_math": "looprl.envs.python_math",
    "number_anywhere": "looprl.envs.hackable:load_number_anywhere",
    "number_final": "looprl.envs.hackable:load_number_final",
    "support_desk": "looprl.envs.support_desk",
}
ENTRY_POINT_GROUP = "looprl.environments"

EnvOption = Callable[[Any], Callable[[Environment], object]]
"""An argument of every environment: `option(value)` checks the value before the environment is
built (ValueError naming the fix) and returns what applies it to the built environment."""

OPTIONS = {
    "judge": "looprl.judge.config:judge_option",
}
"""Arguments every environment takes, by name: the `module:function` of their `EnvOption`."""


@dataclass(frozen=True)
class Registered:
    """An environment known by name: bundled (a row of `BUILTIN`) or an installed package's
    entry point in the group `ENTRY_POINT_GROUP`."""

    name: str
    """What `load_environment(name)` and `looprl eval NAME` take."""
    target: str
    """The `module` or `module:object` holding `load_environment` (or the factory itself)."""
    package: str | None
    """The installed distribution whose entry point registers it; None: bundled with looprl."""
    version: str
    """That distribution's version (looprl's for a bundled environment)."""

    @property
    def source(self) -> str:
        """Where the name comes from: `bundled` or `entry point of package NAME`."""
        return "bundled" if self.package is None else f"entry point of package {self.package}"


def registered_environments() -> list[Registered]:
    """The bundled environments and every entry point of the group, sorted by name; a name two
    register appears twice here (`find_registered` refuses it)."""
    try:
        looprl_version = version("looprl")
    except PackageNotFoundError:  # a source checkout run without installing
        looprl_version = "unknown (not installed)"
    rows = [Registered(name, target, None, looprl_version) for name, target in BUILTIN.items()]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        target = f"{ep.module}:{ep.attr}" if ep.attr else ep.module
        dist = ep.dist
        package, package_version = (dist.name, dist.version) if dist else ("?", "?")
        rows.append(Registered(ep.name, target, package, package_version))
    return sorted(rows, key=lambda row: (row.name, row.package or ""))


def find_registered(name: str) -> Registered | None:
    """The bundled or installed environment called `name`, None when there is none; ValueError
    when two register the name."""
    rows = [row for row in registered_environments() if row.name == name]
    if len(rows) > 1:
        raise ValueError(clash(name, rows))
    return rows[0] if rows else None


def clash(name: str, rows: list[Registered]) -> str:
    """The one-line error for a name that several `rows` register, naming their packages."""
    sources = " and ".join(f"{row.source} ({row.target})" for row in rows)
    packages = [row.package for row in rows if row.package is not None]
    return (
        f"environment {name!r} is registered twice, by {sources}; rename the entry point in the "
        f"pyproject.toml of {' or '.join(packages)} and reinstall it, or pip uninstall "
        f"{packages[-1]}"
    )


def available_environments() -> list[str]:
    """Names of bundled environments and those installed packages register."""
    return sorted({row.name for row in registered_environments()})


def _resolve(reference: str) -> Any:
    """The module `module`, or the object `module:name`, a table row names."""
    module_name, _, name = reference.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, name) if name else module


def _load_entry_point(row: Registered) -> Any:
    """The object an installed package's entry point names; ValueError naming the package and
    the fix when it does not import."""
    module_name, _, attr = row.target.partition(":")
    label = f"{row.name} (entry point {row.target} of package {row.package} {row.version})"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not _is_the_module(exc, module_name):
            raise _import_failed(label, exc) from exc
        raise ValueError(
            f"environment {label} failed to import (no module {exc.name!r} is installed); "
            f"reinstall the package (pip install --force-reinstall {row.package}, or pip "
            f"install -e its folder) or pip uninstall {row.package}"
        ) from exc
    except Exception as exc:  # the package's module: a syntax error or an error while it runs
        raise _import_failed(label, exc) from exc
    found: Any = module
    for part in filter(None, attr.split(".")):
        if not hasattr(found, part):
            raise ValueError(
                f"environment {label}: module {module_name} has no {attr!r}; fix the entry "
                f"point in the pyproject.toml of {row.package} and reinstall it"
            )
        found = getattr(found, part)
    return found


def _import_target(name: str) -> Any:
    """The module (or factory) an environment name stands for, in the order of the module
    docstring; ValueError lists the choices."""
    if is_foreign(name):  # verifiers:MODULE, openenv:MODULE[:CLASS] (looprl/envs/foreign)
        return functools.partial(load_foreign, name)
    row = find_registered(name)
    if row is not None:
        return _resolve(row.target) if row.package is None else _load_entry_point(row)
    try:
        return import_module_or_file(name)
    except FileNotFoundError as exc:
        if name and Path(name).is_dir():  # a folder without a main file: the error names them
            raise ValueError(str(exc)) from exc
        raise _unknown(name) from exc
    except ModuleNotFoundError as exc:
        if not name.endswith(".py") and _is_the_module(exc, name):
            raise _unknown(name) from exc
        raise _import_failed(name, exc) from exc
    except Exception as exc:  # the user's module: a syntax error or an error while it runs
        raise _import_failed(name, exc) from exc


def _is_the_module(exc: ModuleNotFoundError, name: str) -> bool:
    """True when the missing module is `name` itself (or a package above it), not one it imports."""
    missing = exc.name or ""
    module = name.replace("-", "_")
    return module == missing or module.startswith(missing + ".")


def _import_failed(name: str, exc: BaseException) -> ValueError:
    """The error for an environment module that fails to import: the file, line and problem."""
    if isinstance(exc, SyntaxError):
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else name
        problem = f"{type(exc).__name__} at {where}: {exc.msg}"
        fix = "fix the file"
    elif isinstance(exc, ModuleNotFoundError):
        problem = f"it imports {exc.name!r}, which is not installed"
        fix = f"install the package that provides {exc.name!r}, or remove the import"
    else:
        problem = f"{type(exc).__name__} at {_where(exc)}: {exc}"
        fix = "fix the module (LOOPRL_DEBUG=1 shows the traceback)"
    problem = problem.replace("; ", ", ")  # "; " starts the fix (see looprl.cli.fields.usage_error)
    return ValueError(f"environment {name} failed to import ({problem}); {fix}")


def _where(exc: BaseException) -> str:
    """`file:line` of the innermost frame of `exc`'s traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def _unknown(name: str) -> ValueError:
    """The error for a name that is no environment, listing what a name may be."""
    return ValueError(
        f"unknown environment {name!r}; use one of {available_environments()}, a .py file, a "
        "folder holding one, a module path (my_package.my_env), or an installed package "
        "exposing load_environment(**kwargs)"
    )


def _take_options(kwargs: dict[str, Any]) -> list[Callable[[Environment], object]]:
    """Take the `OPTIONS` out of `kwargs` (None: not given) and check each; what applies them."""
    taken = {key: kwargs.pop(key) for key in list(kwargs) if key in OPTIONS}
    return [_resolve(OPTIONS[key])(value) for key, value in taken.items() if value is not None]


def load_environment(name: str, **kwargs: Any) -> Environment:
    """Build an environment: `load_environment(**kwargs)` of the named module or package.

    The `OPTIONS` among `kwargs` (`judge`) are taken here, not passed on: each is checked before
    the environment is built and applied to it after.
    """
    applies = _take_options(kwargs)
    target = _import_target(name)
    factory = (
        target
        if callable(target) and not hasattr(target, "load_environment")
        else getattr(target, "load_environment", None)
    )
    if factory is None:
        raise ValueError(f"{name!r} was imported but has no load_environment(**kwargs) function")
    try:
        env = factory(**kwargs)
    except TypeError as exc:
        raise ValueError(
            f"load_environment of {name!r} rejected the arguments {sorted(kwargs)}: {exc}"
        ) from exc
    if not isinstance(env, Environment):
        raise ValueError(
            f"load_environment of {name!r} returned {type(env).__name__}, not a looprl "
            "Environment; return an instance of a looprl environment class (looprl.ToolEnv, "
            "looprl.SingleTurnEnv, ...)"
        )
    for apply in applies:
        apply(env)
    return env
