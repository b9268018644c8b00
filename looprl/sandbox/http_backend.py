"""An HTTP backend for SandboxFusion-style code services (`POST {url}/run_code`).

The request is `{"code", "language": "python", "run_timeout", "compile_timeout", "files": {},
"fetch_files": []}`; the answer `{"status": "Success" | "Failed" | "SandboxError", "message",
"run_result": {"status": "Finished" | "TimeLimitExceeded" | "Error", "return_code", "stdout",
"stderr", "execution_time"}}`, as in SandboxFusion's `sandbox_api.py`. The service is stateless,
so the code is wrapped in a small driver that evaluates the trailing expression (its `repr` is
printed after a random marker and taken out of stdout). Sessions are emulated by replaying the
session's earlier successful cells, with their output discarded (into a text stream that has a
`buffer`, like a real stdout, so cells that write bytes replay too), before the new cell: state is
rebuilt each call (side effects and randomness are re-run). Connection failures, HTTP errors and
`SandboxError` become `sandbox_error`, never the model's fault.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from collections.abc import Hashable
from typing import Any

import httpx

from looprl.sandbox.base import ExecResult, ExecStatus, Executor, IsolationReport, SandboxLimits
from looprl.sandbox.fair import FairQueue

_DRIVER = """
import ast as _ast, base64 as _b64, contextlib as _cl, io as _io, json as _json, sys as _sys
_cells = _json.loads(_b64.b64decode("{cells}").decode())
_ns = {{"__name__": "__main__"}}
for _i, _src in enumerate(_cells):
    _last = _i == len(_cells) - 1
    _tree = _ast.parse(_src, "<cell>", "exec")
    _expr = None
    if _tree.body and isinstance(_tree.body[-1], _ast.Expr):
        _expr = _ast.Expression(_tree.body.pop().value)
    with (_cl.nullcontext() if _last else _cl.redirect_stdout(_io.TextIOWrapper(_io.BytesIO()))):
        exec(compile(_tree, "<cell>", "exec"), _ns)
        _value = eval(compile(_expr, "<cell>", "eval"), _ns) if _expr is not None else None
    if _last and _value is not None:
        _sys.stdout.flush()
        print("\\n{marker}" + _json.dumps(repr(_value)[:{max_value}]))
"""


class HttpExecutor(Executor):
    """Runs code on a SandboxFusion-compatible HTTP service.

    Args:
        url: Base URL of the service, e.g. "http://sandbox:8080" (POST {url}/run_code).
        limits: Only `timeout`, `max_output_bytes` and `max_value_chars` apply client-side; the
            service enforces its own memory and process limits.
        request_timeout_slack: Seconds the HTTP request may take beyond the run timeout.
        max_connections: Concurrent requests (shared fairly between callers, see `fair`).
        headers: Extra HTTP headers (e.g. an authorization token).
    """

    name = "http"

    def __init__(
        self,
        url: str,
        limits: SandboxLimits | None = None,
        *,
        request_timeout_slack: float = 10.0,
        max_connections: int = 32,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(limits)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/") + "/run_code"
        self.slack = request_timeout_slack
        self._marker = f"__looprl_value_{secrets.token_hex(8)}__"
        self._client_args: dict[str, Any] = {
            "headers": headers,
            "limits": httpx.Limits(max_connections=max_connections),
            "trust_env": False,
        }
        self._client = httpx.AsyncClient(**self._client_args)
        self._slots = FairQueue(max_connections)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sessions: dict[str, list[str]] = {}

    def isolation_report(self) -> IsolationReport:
        """`remote`: the isolation is whatever the service provides."""
        return IsolationReport(
            self.name,
            "remote",
            {"endpoint": self.url, "sessions": "emulated by replaying earlier cells"},
            notes=[
                "isolation is enforced by the remote service; see docs/sandbox.md for container flags"
            ],
        )

    def _program(self, cells: list[str]) -> str:
        payload = base64.b64encode(json.dumps(cells).encode()).decode()
        return _DRIVER.format(
            cells=payload, marker=self._marker, max_value=self.limits.max_value_chars
        )

    async def _run(self, code: str, session_id: str | None, t: float, who: Hashable) -> ExecResult:
        """Send the code (after the session's earlier cells) and map the answer to an ExecResult."""
        slot = await self._slots.acquire(who)
        try:
            return await self._execute(code, session_id, t)
        finally:
            self._slots.release(slot, who)

    async def _execute(self, code: str, session_id: str | None, t: float) -> ExecResult:
        """One request, holding a connection slot."""
        history = self._sessions.get(session_id, []) if session_id is not None else []
        body = {
            "code": self._program([*history, code]),
            "language": "python",
            "run_timeout": t,
            "compile_timeout": t,
            "files": {},
            "fetch_files": [],
        }
        loop = asyncio.get_running_loop()
        if (
            self._loop is not None and loop is not self._loop
        ):  # pooled connections die with their loop
            self._client = httpx.AsyncClient(**self._client_args)
        self._loop = loop
        start = time.monotonic()
        try:
            response = await self._client.post(self.url, json=body, timeout=t + self.slack)
            response.raise_for_status()
            data = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            return ExecResult(
                "sandbox_error",
                duration=time.monotonic() - start,
                message=f"sandbox service failed ({type(exc).__name__}: {exc}); not the code's fault, retry",
            )
        result = self._parse(data, t)
        result.duration = time.monotonic() - start
        if session_id is not None and result.ok:
            self._sessions.setdefault(session_id, []).append(code)
        return result

    def _parse(self, data: dict[str, Any], timeout: float) -> ExecResult:
        """Map a SandboxFusion answer onto our statuses."""
        run = data.get("run_result") or {}
        if data.get("status") == "SandboxError" or run.get("status") == "Error" or not run:
            msg = data.get("message") or run.get("stderr") or "no run result"
            return ExecResult("sandbox_error", message=f"sandbox service error: {str(msg)[:500]}")
        stdout, value = self._split_value(str(run.get("stdout") or ""))
        stderr = str(run.get("stderr") or "")
        status: ExecStatus = "ok"
        message = ""
        code = run.get("return_code")
        if run.get("status") == "TimeLimitExceeded":
            status, message = (
                "timeout",
                f"the code ran longer than the {timeout:g} s time limit and was stopped",
            )
        elif code not in (0, None):
            lines = stderr.strip().splitlines()
            status, message = "error", lines[-1] if lines else f"exit code {code}"
            if "MemoryError" in stderr:
                status = "memory"
            elif isinstance(code, int) and (code < 0 or code >= 128) and not lines:
                status, message = "killed", f"the process was killed (exit code {code})"
        cap = self.limits.max_output_bytes
        truncated = len(stdout) + len(stderr) > cap
        if truncated:
            status, message = "output_limit", f"output passed the {cap}-byte limit"
            stdout, stderr = stdout[:cap], stderr[: max(0, cap - len(stdout))]
        return ExecResult(status, stdout, stderr, value, message=message, truncated=truncated)

    def _split_value(self, stdout: str) -> tuple[str, str | None]:
        """Take the marker line (the trailing expression's repr) out of stdout."""
        head, sep, tail = stdout.rpartition("\n" + self._marker)
        if not sep:
            return stdout, None
        try:
            value = json.loads(tail.strip())
        except ValueError:
            return stdout, None
        return head, value if isinstance(value, str) else None

    async def close_session(self, session_id: str) -> None:
        """Forget the session's replay history."""
        self._sessions.pop(session_id, None)

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()
