"""Load environments by name (`calculator`), module path, file path or installed package.

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
from importlib.metadata import entry_points
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


def available_environments() -> list[str]:
    """Names of built-in environments and those installed packages register."""
    names = set(BUILTIN)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def _resolve(reference: str) -> Any:
    """The module `module`, or the object `module:name`, a table row names."""
    module_name, _, name = reference.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, name) if name else module


def _import_target(name: str) -> Any:
    """The module (or factory) an environment name stands for; ValueError lists the choices."""
    if is_foreign(name):  # verifiers:MODULE, openenv:MODULE[:CLASS] (looprl/envs/foreign)
        return functools.partial(load_foreign, name)
    if name in BUILTIN:
        return _resolve(BUILTIN[name])
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    try:
        return import_module_or_file(name)
    except FileNotFoundError as exc:
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
        f"unknown environment {name!r}; use one of {available_environments()}, a module path "
        "(my_package.my_env), a .py file, or an installed package exposing load_environment(**kwargs)"
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
