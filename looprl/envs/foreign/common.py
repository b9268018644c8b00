"""What both foreign-environment adapters need: the optional package, the module, signal handlers."""

from __future__ import annotations

import contextlib
import importlib
import signal
import threading
from collections.abc import Iterator
from types import ModuleType

from looprl.files import import_module_or_file


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
            f"pip install -e '.[{extra}]' (make setup-test does)"
        ) from None


def import_environment_module(target: str) -> ModuleType:
    """Import the module a foreign environment lives in: a module path, an installed package
    (`-` read as `_`) or a `.py` file; ValueError says what to give instead."""
    try:
        return import_module_or_file(target)
    except FileNotFoundError:
        raise ValueError(f"environment file {target!r} does not exist") from None
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
