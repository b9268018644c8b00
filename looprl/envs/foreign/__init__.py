"""Environments written for other frameworks (verifiers, OpenEnv), run through looprl's rollout.

`load_foreign("verifiers:MODULE", **kwargs)` and `load_foreign("openenv:MODULE[:CLASS]", **kwargs)`
return a looprl `Environment` that wraps the foreign one; `looprl.envs.registry` sends every name
with one of these prefixes here. What each adapter maps, and what it refuses, is in
docs/environments.md ("verifiers environments", "OpenEnv environments").
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from looprl.envs.base import Environment

PREFIXES = ("verifiers:", "openenv:")
"""Name prefixes that select a foreign-environment adapter."""


def is_foreign(name: str) -> bool:
    """True when `name` asks for a foreign environment (`verifiers:...`, `openenv:...`)."""
    return name.startswith(PREFIXES)


def load_foreign(name: str, **kwargs: Any) -> Environment:
    """The looprl environment that runs the foreign environment `name` (see the module docstring)."""
    prefix, _, target = name.partition(":")
    if not target:
        raise ValueError(
            f"{name!r} names no module; write {prefix}:MODULE (a module path, an installed "
            "package or a .py file)"
        )
    if prefix == "verifiers":
        from looprl.envs.foreign.verifiers import load_verifiers_environment

        return load_verifiers_environment(target, **kwargs)
    from looprl.envs.foreign.openenv import load_openenv_environment

    return load_openenv_environment(target, **kwargs)


def require(package: str, extra: str, what: str) -> ModuleType:
    """Import `package`, or raise ValueError naming the extra that installs it (a ValueError so
    that `looprl train`/`eval` print it as their one-line error)."""
    try:
        return importlib.import_module(package)
    except ModuleNotFoundError as exc:
        if exc.name != package:
            raise
        raise ValueError(
            f"{what} needs the {package!r} package, which is not installed; install it with "
            f"pip install 'looprl[{extra}]' (make setup does)"
        ) from None


def import_module_or_file(target: str) -> ModuleType:
    """Import a module path, an installed package (`-` read as `_`) or a `.py` file."""
    from looprl.envs.registry import import_file  # the registry imports this package

    path = Path(target)
    if path.suffix == ".py":
        if not path.exists():
            raise ValueError(f"environment file {target!r} does not exist")
        return import_file(path)
    try:
        return importlib.import_module(target.replace("-", "_"))
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"cannot import {target!r} ({exc}); give a module path (my_pkg.my_env), an "
            "installed package name or a .py file"
        ) from exc


@contextlib.contextmanager
def keep_signal_handlers() -> Iterator[None]:
    """Restore SIGINT and SIGTERM handlers after the block (verifiers installs its own)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in saved.items():
                if handler is not None:
                    signal.signal(sig, handler)
