"""Environments written for other frameworks (verifiers, OpenEnv), run through looprl's rollout.

`load_foreign("verifiers:MODULE", **kwargs)` (the 0.1 API), `load_foreign("verifiers-v1:TASKSET",
**kwargs)` (the v1 API, in a venv of its own) and `load_foreign("openenv:MODULE[:CLASS]", **kwargs)`
return a looprl `Environment` that wraps the foreign one; `looprl.envs.registry` sends every name
with one of these prefixes here. What each adapter maps, and what it refuses, is in
docs/environments.md ("verifiers environments", "verifiers v1 environments", "OpenEnv
environments").
"""

from __future__ import annotations

from typing import Any

from looprl.envs.base import Environment

PREFIXES = ("verifiers:", "verifiers-v1:", "openenv:")
"""Name prefixes that select a foreign-environment adapter."""


def is_foreign(name: str) -> bool:
    """True when `name` asks for a foreign environment (`verifiers:...`, `verifiers-v1:...`,
    `openenv:...`)."""
    return name.startswith(PREFIXES)


def load_foreign(name: str, **kwargs: Any) -> Environment:
    """The looprl environment that runs the foreign environment `name` (see the module docstring)."""
    prefix, _, target = name.partition(":")
    if not target:
        raise ValueError(
            f"{name!r} names no module; write {prefix}:MODULE (a module path, an installed "
            "package or a .py file)"
        )
    if prefix == "verifiers-v1":
        from looprl.envs.foreign.verifiers_v1 import load_verifiers_v1_environment

        return load_verifiers_v1_environment(target, **kwargs)
    if prefix == "verifiers":
        from looprl.envs.foreign.verifiers import load_verifiers_environment

        return load_verifiers_environment(target, **kwargs)
    from looprl.envs.foreign.openenv import load_openenv_environment

    return load_openenv_environment(target, **kwargs)
