"""Load environments by name (`calculator`), module path, file path or installed package."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from looprl.envs.base import Environment
from looprl.envs.foreign import is_foreign, load_foreign

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
}
ENTRY_POINT_GROUP = "looprl.environments"


def available_environments() -> list[str]:
    """Names of built-in environments and those installed packages register."""
    names = set(BUILTIN)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def import_file(path: Path) -> ModuleType:
    """Import an environment's `.py` file as a module named after it."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import environment file {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _import_target(name: str) -> Any:
    if is_foreign(name):  # verifiers:MODULE, openenv:MODULE[:CLASS] (looprl/envs/foreign)
        return functools.partial(load_foreign, name)
    if name in BUILTIN:  # "module" or "module:function"
        module_name, _, function = BUILTIN[name].partition(":")
        loaded = importlib.import_module(module_name)
        return getattr(loaded, function) if function else loaded
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    path = Path(name)
    if path.suffix == ".py" and path.exists():
        return import_file(path)
    try:
        return importlib.import_module(name.replace("-", "_"))
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"unknown environment {name!r}; use one of {available_environments()}, a module path "
            "(my_package.my_env), a .py file, or an installed package exposing load_environment(**kwargs)"
        ) from exc


def load_environment(name: str, **kwargs: Any) -> Environment:
    """Build an environment: `load_environment(**kwargs)` of the named module or package.

    `judge` is taken here, not passed on: a table naming an LLM judge (`looprl.judge.config`)
    that is added to the environment's rubric with its weight.
    """
    judge = kwargs.pop("judge", None)
    if judge is not None:
        from looprl.judge.config import judge_config

        judge = judge_config(judge)  # a bad judge fails before the environment is built
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
        raise TypeError(
            f"load_environment of {name!r} returned {type(env).__name__}, expected a looprl Environment"
        )
    if judge is not None:
        from looprl.judge.config import attach_judge

        attach_judge(env, judge)
    return env
