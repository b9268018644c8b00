"""A vLLM server that looprl starts, watches, feeds new weights and always stops.

`VLLMServer(model_dir).start()` runs `python -m vllm.entrypoints.openai.api_server` in the vLLM
venv (`looprl.engines.vllm_venv`) on 127.0.0.1 and a free port, under `vllm_shim.py`: the
server's whole process group dies with the trainer, even when the trainer is SIGKILLed. Start-up
waits for `/health` and fails with one message naming the cause and the tail of the server log
(a model vLLM cannot load, a port taken, a timeout). The log is a temporary file unless
`log_path` names one: it is removed when the server stops cleanly, and kept (its path in the
error) once the server failed to start, died, or failed a reload, since then its text is the
evidence. Paths in `remove_if_orphaned` (the trainer's files in RAM) are removed by the shim
when the trainer dies without stopping the server. `reload_weights(dir)` swaps in new
safetensors weights through vLLM's `collective_rpc` (the dev-mode endpoint) and drops the
prefix cache, whose keys and values belong to the old weights. `paused(roots, version=v)` holds
generation while a block swaps weights, requests in flight kept (`/pause?mode=keep`), and on the
way out labels the weights `v`, preempts the running requests and resumes. `--enable-scale-out`
serves `/inference/v1/generate`, whose answers carry each token's weight label.

Options chosen for a CPU: `--enforce-eager` (no compile warm-up: start-up 25 s instead of about
100 s for the tiny model), float32, `--logprobs-mode processed_logprobs` (logprobs after
temperature, as the trainer computes them), a KV cache of `kv_cache_gb` GiB, and
`--no-enable-chunked-prefill`: in vLLM 0.32.0 on CPU a *seeded* request whose prefill is split
into chunks (once the prompts in flight pass 2048 tokens) kills the engine core with
"CPU Generator does not use offset", and every training request is seeded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from looprl.engines.vllm_venv import VLLMSetupError, vllm_python

SHIM = Path(__file__).with_name("vllm_shim.py")
REMOVE_FLAG = "--remove-if-orphaned"  # vllm_shim.py's option
SERVED_NAME = "policy"


class VLLMServerError(RuntimeError):
    """A vLLM server failed to start or died; the message names the cause and the fix."""


def reload_weights(base_url: str, weights_dir: Path, timeout: float = 120.0) -> None:
    """Have the vLLM server at `base_url` (`.../v1`) load the safetensors in `weights_dir`.

    The server must run with `VLLM_SERVER_DEV_MODE=1` and see `weights_dir` (same machine or a
    shared file system); its prefix cache is dropped after the reload.
    """
    root = base_url.rstrip("/").removesuffix("/v1")
    body = {"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}}
    try:
        httpx.post(f"{root}/collective_rpc", json=body, timeout=timeout).raise_for_status()
        httpx.post(f"{root}/reset_prefix_cache", timeout=timeout).raise_for_status()
    except httpx.HTTPError as exc:
        raise VLLMServerError(
            f"reloading weights into the vLLM server at {root} failed ({exc}); it needs "
            "VLLM_SERVER_DEV_MODE=1 and read access to the weights directory"
        ) from None


def post_admin(
    url: str,
    body: dict[str, Any] | None = None,
    *,
    params: dict[str, str] | None = None,
    timeout: float = 120.0,
) -> None:
    """POST to a vLLM admin endpoint; a failure says which and why."""
    try:
        httpx.post(url, json=body, params=params, timeout=timeout).raise_for_status()
    except httpx.HTTPError as exc:
        detail = exc.response.text[:500] if isinstance(exc, httpx.HTTPStatusError) else str(exc)
        raise VLLMServerError(
            f"POST {url} failed: {detail} (the server needs VLLM_SERVER_DEV_MODE=1)"
        ) from None


@contextlib.contextmanager
def paused(roots: list[str], *, version: int) -> Iterator[None]:
    """Hold generation on the servers at `roots` while the block swaps their weights.

    `/pause?mode=keep` returns once the engine step under way has finished; no step runs until
    `/resume` and the requests in flight stay queued. On the way out every server labels its
    weights `version` (`/update_weight_version`: vLLM stamps each later token with it), preempts
    its running requests (`/reset_prefix_cache?reset_running_requests=true`: their keys and
    values, computed by the old weights, are dropped and computed again by the new ones before
    their next token) and resumes.
    """
    try:
        for root in roots:
            post_admin(f"{root}/pause", params={"mode": "keep"})
        yield
    finally:  # every server resumes, even when one of them failed
        failed = [problem for root in roots if (problem := _resume(root, version))]
        if failed:
            raise VLLMServerError("; ".join(failed))


def _resume(root: str, version: int) -> str | None:
    """Label, preempt and resume the server at `root` (see `paused`); what failed, or None."""
    try:
        post_admin(f"{root}/update_weight_version", {"new_version": str(version)})
        post_admin(f"{root}/reset_prefix_cache", params={"reset_running_requests": "true"})
        post_admin(f"{root}/resume")
    except VLLMServerError as exc:
        return str(exc)
    return None


def url_problem(base_url: str, timeout: float = 5.0) -> str | None:
    """Why `base_url` cannot be a vLLM server's URL (not http(s), no server answers), or None.

    Any HTTP answer at `ROOT/health` counts as a server: what it serves is checked later.
    """
    try:
        host = httpx.URL(base_url).host if base_url.startswith(("http://", "https://")) else ""
    except httpx.InvalidURL:
        host = ""
    if not host:
        return "not an http(s) URL; give each server as http://HOST:PORT/v1"
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        httpx.get(f"{root}/health", timeout=timeout)
    except httpx.HTTPError as exc:
        return f"no server answers ({exc}); start the vLLM server there first, or fix the URL"
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VLLMServer:
    """One vLLM OpenAI-compatible server on 127.0.0.1 (see the module doc).

    `model_dir` is a Hugging Face model directory; `max_model_len` bounds prompt plus output;
    `startup_timeout` bounds the wait for `/health`; `log_path` receives the server's output
    (default: a temporary file, removed on a clean stop); `remove_if_orphaned` are removed by
    the shim if this process dies first. Use it as a context manager or call `start()`/`stop()`.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        max_model_len: int = 2048,
        seed: int = 0,
        port: int | None = None,
        startup_timeout: float = 300.0,
        kv_cache_gb: int = 1,
        log_path: Path | None = None,
        extra_args: tuple[str, ...] = (),
        remove_if_orphaned: tuple[Path, ...] = (),
    ) -> None:
        self.model_dir = Path(model_dir)
        self.max_model_len = max_model_len
        self.seed = seed
        self.port = port
        self.startup_timeout = startup_timeout
        self.kv_cache_gb = kv_cache_gb
        self.own_log = log_path is None  # a temporary log: removed on a clean stop
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="looprl-vllm-", suffix=".log")[1])
        self.extra_args = extra_args
        self.remove_if_orphaned = remove_if_orphaned
        self.failed = False  # it failed to start, died or failed a reload: its log is kept
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def base_url(self) -> str:
        """The OpenAI API root, e.g. `http://127.0.0.1:8000/v1`."""
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self, python: Path) -> list[str]:
        """The shim (with what it removes if this process dies) plus vLLM's command line."""
        orphaned = [*self.remove_if_orphaned, *([self.log_path] if self._log_disposable() else [])]
        return [
            str(python), str(SHIM), *[a for p in orphaned for a in (REMOVE_FLAG, str(p))], "--",
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
            "--max-model-len", str(self.max_model_len), "--seed", str(self.seed),
            "--enforce-eager", "--logprobs-mode", "processed_logprobs",
            "--gpu-memory-utilization", "0.1", "--no-enable-chunked-prefill",
            "--enable-scale-out", *self.extra_args,
        ]  # fmt: skip

    def start(self) -> str:
        """Start the server and wait until it is healthy; returns its base URL."""
        try:
            python = vllm_python()
        except VLLMSetupError as exc:
            self._drop_log()  # nothing was written to it
            raise VLLMServerError(str(exc)) from None
        for _attempt in range(3):
            explicit = self.port is not None
            self.port = self.port or free_port()
            self._launch(python)
            try:
                self._wait_healthy()
                return self.base_url
            except VLLMServerError as exc:
                retry = not explicit and "address already in use" in str(exc).lower()
                self.failed = self.failed or not retry
                self.stop()
                if not retry:
                    raise
                self.port = None  # someone took the port first: try another
        raise VLLMServerError("three free ports were taken before vLLM could bind one")

    def _launch(self, python: Path) -> None:
        env = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc, /pause, /resume, weight labels
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # /v1/load_lora_adapter
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gb),
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(python), stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,  # its own process group: stop() kills all of vLLM
            )  # fmt: skip

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise VLLMServerError(
                    f"the vLLM server exited with code {self.process.returncode} while starting "
                    f"(model {self.model_dir}); the end of its log {self.log_path}:\n{self.log_tail()}"
                )
            if self.healthy():
                return
            time.sleep(0.5)
        raise VLLMServerError(
            f"the vLLM server was not healthy after {self.startup_timeout:g} s (raise "
            f"engine.startup_timeout on a slow machine); the end of its log {self.log_path}:\n"
            f"{self.log_tail()}"
        )

    def healthy(self) -> bool:
        """Whether `/health` answers 200 now."""
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def alive(self) -> bool:
        """Whether the server process is still running."""
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        """The last lines of the server log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def reload_weights(self, weights_dir: Path, timeout: float = 120.0) -> None:
        """Load new safetensors weights from `weights_dir` in place; later requests use them."""
        try:
            reload_weights(self.base_url, weights_dir, timeout)
        except VLLMServerError as exc:
            self.failed = True
            raise VLLMServerError(
                f"{exc}; the end of its log {self.log_path}:\n{self.log_tail()}"
            ) from None

    def restart(self) -> str:
        """Start a dead server again on the same model; returns its base URL (the log that says
        why it died is kept)."""
        self.failed = True
        self.stop()
        self.restarts += 1
        self.port = None
        return self.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server's whole process group: SIGTERM, then SIGKILL after `timeout` s; remove
        its temporary log unless it failed."""
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            _kill_group(proc, timeout)
        elif proc is not None:
            self.failed = True  # it had died on its own: its log says why
        self._drop_log()

    def _log_disposable(self) -> bool:
        return self.own_log and not self.failed

    def _drop_log(self) -> None:
        if self._log_disposable():
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _kill_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the process group of `proc`, then SIGKILL it if it still runs after `timeout` s."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
