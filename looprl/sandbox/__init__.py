"""Sandboxed Python execution for tools: one executor interface, several isolation backends.

    from looprl.sandbox import make_executor, make_python_tools

    executor = make_executor()            # fork server on Linux, subprocess elsewhere
    await executor.start()                # logs the isolation level actually achieved
    result = await executor.execute("import sympy; sympy.factor('x**2-1')")
    python, python_session = make_python_tools(executor)

See docs/sandbox.md for the isolation design and the production set-up.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from looprl.sandbox.base import (
    EXEC_STATUSES,
    ExecResult,
    ExecStatus,
    Executor,
    IsolationReport,
    SandboxLimits,
)
from looprl.sandbox.forkserver import ForkServerExecutor
from looprl.sandbox.http_backend import HttpExecutor
from looprl.sandbox.subprocess_backend import SubprocessExecutor
from looprl.sandbox.tool import SESSION_KEY, format_result, make_python_tools, new_session_id

BACKENDS = {
    "forkserver": ForkServerExecutor,
    "subprocess": SubprocessExecutor,
    "http": HttpExecutor,
}


def make_executor(
    backend: str = "auto", limits: SandboxLimits | None = None, **kwargs: Any
) -> Executor:
    """Build an executor by name: "auto" (fork server on Linux, else subprocess), or one of BACKENDS."""
    if backend == "auto":
        backend = "forkserver" if sys.platform == "linux" else "subprocess"
        if backend == "subprocess":
            logging.getLogger("looprl.sandbox").warning(
                "no fork-server sandbox on %s", sys.platform
            )
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown sandbox backend {backend!r}; choose one of {sorted(BACKENDS)} or 'auto'"
        )
    cls: Any = BACKENDS[backend]
    return cls(limits=limits, **kwargs)


__all__ = [
    "BACKENDS",
    "EXEC_STATUSES",
    "ExecResult",
    "ExecStatus",
    "Executor",
    "ForkServerExecutor",
    "HttpExecutor",
    "IsolationReport",
    "SESSION_KEY",
    "SandboxLimits",
    "SubprocessExecutor",
    "format_result",
    "make_executor",
    "make_python_tools",
    "new_session_id",
]
