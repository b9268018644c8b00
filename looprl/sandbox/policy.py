"""The fork server's typed settings: what the pool tells a worker, what a worker imposes on a child.

`WorkerConfig` is the one frame the pool sends a new worker (JSON over the worker's stdin:
`to_dict` on the pool's side, `from_dict` in the worker). `ChildPolicy` is how a worker hardens
each sandbox child; it never crosses a process boundary except by fork, so it may hold a
compiled seccomp filter. Both are frozen: a template that learns something about itself (its
address-space size, that it installed the filter) makes its own copy with `dataclasses.replace`.
The per-call amounts (memory, processes, output) are `SandboxLimits`, kept apart from both.
Standard library only (with `base`), because workers import it before anything else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from looprl.sandbox.base import SandboxLimits

if TYPE_CHECKING:
    from looprl.sandbox.seccomp import SeccompFilter


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a fork-server worker needs to start (see `ForkServerExecutor` for the knobs)."""

    limits: SandboxLimits
    """Resource limits for every call the worker runs."""
    scratch_root: str
    """Directory for scratch directories (the worker's own tmpfs once it has a minimal root)."""
    preload: tuple[str, ...] = ()
    """Modules the full template imports once, so calls need not."""
    lean_preload: tuple[str, ...] | None = None
    """Modules of a second, lean template (a proper subset of `preload`); None: one template."""
    warmup: bool = True
    """Run common calls of the preloaded modules once per template (warm caches for children)."""
    namespaces: bool = True
    """Enter new mount/network/PID namespaces (off only for debugging)."""
    freeze_sessions: bool = True
    """Stop a session's interpreter (SIGSTOP) between calls."""
    hugepages: bool = True
    """Back each template's heap with huge pages (cheaper forks and exits)."""
    uid: int | None = None
    """The full template's stateless uid (used only when the worker is root)."""
    lean_uid: int | None = None
    """The lean template's stateless uid (as root the lean template needs one of its own)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON frame sent to the worker ("op": "config", the limits as a dict)."""
        d = dataclasses.asdict(self)
        for name in ("preload", "lean_preload"):
            d[name] = None if d[name] is None else list(d[name])
        return {"op": "config", **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkerConfig:
        """Inverse of `to_dict` (its "op" key is dropped; any other unknown key is a TypeError)."""
        fields = {k: v for k, v in d.items() if k != "op"}
        fields["limits"] = SandboxLimits.from_dict(fields["limits"])
        fields["preload"] = tuple(fields.get("preload", ()))
        lean = fields.get("lean_preload")
        fields["lean_preload"] = None if lean is None else tuple(lean)
        return cls(**fields)


@dataclass(frozen=True)
class ChildPolicy:
    """How a worker hardens each sandbox child (see `isolation.harden_child`), apart from limits."""

    landlock_abi: int
    """The kernel's Landlock ABI version (0: no Landlock)."""
    read_only: tuple[str, ...]
    """Paths the code may read (the Python installation, system libraries, a few devices)."""
    seccomp: SeccompFilter | None
    """The compiled seccomp filter (None: the architecture is not supported)."""
    nproc_extra: int = 0
    """Added to RLIMIT_NPROC: processes the worker's uid already has (non-root workers share it)."""
    baseline_vm: int = 0
    """Address-space bytes of the process that forks (RLIMIT_AS is this plus `memory_mb`); set
    by each template after its preload."""
    seccomp_inherited: bool = False
    """The template installed `seccomp` on itself, so its children already run under it."""
    prepared_scratch: str | None = None
    """The scratch directory the template prepared environment and signals for (its stateless
    children inherit them and skip that step)."""
