"""The executor interface every sandbox backend implements, its result record, limits and report.

One call runs one piece of model-written Python and ends in exactly one `ExecResult` whose
`status` is one of `EXEC_STATUSES`:

- `ok`: the code finished (a trailing expression's `repr` is in `value`);
- `error`: it raised (traceback in `stderr`), had a syntax error, or exited with a non-zero code;
- `timeout`: it ran past the wall-clock (or CPU-time) limit and was killed;
- `memory`: it tried to use more memory than allowed (MemoryError);
- `output_limit`: it printed more than the output cap and was stopped;
- `killed`: it died from a signal it brought on itself (a crash such as SIGSEGV);
- `sandbox_error`: the *infrastructure* failed (a worker died, a remote service was down).

`sandbox_error` is never the model's fault: rubrics and metrics should exclude such calls (or the
whole episode) instead of scoring them as mistakes; `ExecResult.model_fault` says which is which.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Literal

ExecStatus = Literal["ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error"]
EXEC_STATUSES: tuple[ExecStatus, ...] = (
    "ok",
    "error",
    "timeout",
    "memory",
    "output_limit",
    "killed",
    "sandbox_error",
)
IsolationLevel = Literal["strong", "partial", "weak", "remote"]


@dataclass
class ExecResult:
    """What one sandboxed call produced.

    `value` is the `repr` of the code's trailing expression (None when there is none or it is
    None). `message` explains a non-ok status in words the model can act on (empty when ok and
    nothing notable happened). `duration` is the sandbox-side wall time in seconds, excluding any
    wait for a free worker. `truncated` says stdout/stderr were cut at the output cap.
    `session_reset` says a session's earlier variables are gone (after a timeout, a crash, or a
    restarted worker).
    """

    status: ExecStatus
    stdout: str = ""
    stderr: str = ""
    value: str | None = None
    duration: float = 0.0
    message: str = ""
    truncated: bool = False
    session_reset: bool = False

    def __post_init__(self) -> None:
        if self.status not in EXEC_STATUSES:
            raise ValueError(f"unknown exec status {self.status!r}; choose one of {EXEC_STATUSES}")

    @property
    def ok(self) -> bool:
        """True when the code ran to completion."""
        return self.status == "ok"

    @property
    def model_fault(self) -> bool:
        """True when a non-ok status is due to the code (everything except ok and sandbox_error)."""
        return self.status not in ("ok", "sandbox_error")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExecResult:
        """Inverse of `to_dict` (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for every sandboxed call; each applies per call unless it says otherwise."""

    timeout: float = 10.0
    """Wall-clock seconds per call (the default when `execute` gets no timeout)."""
    memory_mb: int = 1024
    """Address space the code may add on top of the preloaded interpreter (RLIMIT_AS)."""
    max_processes: int = 16
    """Processes and threads the code may have at once, itself included (RLIMIT_NPROC)."""
    max_file_mb: int = 16
    """Largest file the code may write (RLIMIT_FSIZE)."""
    disk_mb: int = 64
    """Size of the scratch directory (a tmpfs where the fork server can mount one)."""
    max_open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""
    max_output_bytes: int = 256 * 1024
    """stdout + stderr kept before the call is stopped with status `output_limit`."""
    max_value_chars: int = 10_000
    """Longest `repr` of the trailing expression kept in `ExecResult.value`."""
    session_cpu_seconds: int = 600
    """CPU seconds a session's interpreter may use over its whole life (RLIMIT_CPU, soft = hard)."""

    def __post_init__(self) -> None:
        for name in ("timeout", "memory_mb", "max_processes", "max_file_mb", "disk_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}")
        if self.max_open_files < 16:
            raise ValueError(
                f"SandboxLimits.max_open_files must be >= 16, got {self.max_open_files}"
            )
        if self.max_output_bytes < 1024:
            raise ValueError(
                f"SandboxLimits.max_output_bytes must be >= 1024, got {self.max_output_bytes}"
            )

    def cpu_seconds(self, timeout: float) -> int:
        """The per-call CPU-time limit that goes with a wall-clock timeout (one second of slack)."""
        return math.ceil(timeout) + 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (sent to workers, saved in run metadata)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SandboxLimits:
        """Inverse of `to_dict` (in a worker or child process); an unknown key is a TypeError."""
        return cls(**d)


@dataclass
class IsolationReport:
    """The isolation actually in force for a backend, as probed from the kernel and verified.

    `features` maps each layer (uid drop, seccomp, landlock, network, ...) to what was achieved:
    `True`/`False` or a short string. `verified` holds what a probe run *inside* a sandbox saw
    (e.g. `"socket": "blocked (EPERM)"`). Record `to_dict()` in the run metadata.
    """

    backend: str
    level: IsolationLevel
    features: dict[str, Any] = field(default_factory=dict)
    verified: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """A few human-readable lines for the start-up log."""
        lines = [f"sandbox backend={self.backend} isolation={self.level}"]
        lines += [f"  {k}: {v}" for k, v in self.features.items()]
        if self.verified:
            lines.append(
                "  verified inside a sandbox: "
                + ", ".join(f"{k}={v}" for k, v in self.verified.items())
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


class Executor(abc.ABC):
    """Runs Python code in a sandbox. Use `async with executor:` or call `close()` when done.

    Stateless calls (`session_id=None`) each run in a fresh interpreter. Calls that share a
    `session_id` share one interpreter whose variables persist until `close_session` (or until a
    timeout or crash resets it, which the result reports with `session_reset=True`).
    """

    name: str = "executor"

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()

    async def start(self) -> None:  # noqa: B027 - optional hook, most backends start lazily
        """Start workers or connections now instead of at the first call."""

    async def execute(
        self,
        code: str,
        *,
        session_id: str | None = None,
        timeout: float | None = None,
        caller: str | None = None,
    ) -> ExecResult:
        """Run `code`; never raises for anything the code does (see `ExecResult.status`).

        `caller` names who is asking (an episode id): a pool shares its workers fairly between
        callers, so one caller's backlog of long calls does not hold up another caller's quick
        call (see `looprl.sandbox.fair`). Default: the session id; a call with neither counts
        as a caller of its own. Raises TypeError for code that is not a str and ValueError for
        a timeout that is not positive (None: the limits' default).
        """
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        t = self._timeout(timeout)
        return await self._run(code, session_id, t, self._caller(caller, session_id))

    @abc.abstractmethod
    async def _run(
        self, code: str, session_id: str | None, timeout: float, who: Hashable
    ) -> ExecResult:
        """The backend's own `execute`: arguments already checked, `who` the fair-share key."""

    async def close_session(self, session_id: str) -> None:  # noqa: B027 - stateless backends
        """Forget a session and free its interpreter (unknown ids are ignored)."""

    async def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Stop all workers and sessions and remove scratch files."""

    @abc.abstractmethod
    def isolation_report(self) -> IsolationReport:
        """The isolation level in force (complete once `start()` has run)."""

    @staticmethod
    def _caller(caller: str | None, session_id: str | None) -> Hashable:
        """The key a call is queued under: `caller`, else its session, else a key of its own."""
        if caller is not None:
            return caller
        return session_id if session_id is not None else object()

    def _timeout(self, timeout: float | None) -> float:
        """The call's timeout, validated (None means the limits' default)."""
        t = self.limits.timeout if timeout is None else float(timeout)
        if not t > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        return t

    async def __aenter__(self) -> Executor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
