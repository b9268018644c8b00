"""Runs cells of model-written code inside a sandbox child and reports each result as a frame.

This module runs *inside* the sandbox, after the isolation layers are in place. A cell is run
like a notebook cell: its statements are executed and the value of a trailing expression is
captured as a `repr`. stdout and stderr are real pipes to the supervisor, wrapped in streams
that stop the code with status `output_limit` once the output cap is reached (the supervisor
also enforces the cap from outside, for output that bypasses these streams). Standard library
only: the fork-server worker imports this module before the preloaded libraries.
"""

from __future__ import annotations

import ast
import io
import linecache
import os
import resource
import sys
import traceback
from typing import TYPE_CHECKING, Any

from looprl.sandbox import proto

if TYPE_CHECKING:
    from looprl.sandbox.base import SandboxLimits

RESULT_FD = 3
CONTROL_FD = 4
READY_FRAME = proto.encode({"ready": True})  # encoded once in the worker, not in every child


class OutputLimitExceeded(BaseException):
    """Raised inside user code when stdout + stderr pass the cap (a BaseException, so that a
    bare `except Exception` in the model's code does not swallow it)."""


class _Budget:
    """Bytes of output still allowed, shared by stdout and stderr."""

    def __init__(self, limit: int) -> None:
        self.left = limit


class CappedStream(io.TextIOBase):
    """A text stream writing UTF-8 to a file descriptor, stopping the code at the output cap.

    Its `buffer` is the binary side (`sys.stdout.buffer.write(b"...")`, as on a real stdout);
    both sides share one buffer and the output budget, so text and bytes keep their order.
    """

    def __init__(self, fd: int, budget: _Budget, buffer_size: int = 8192) -> None:
        self._fd = fd
        self._budget = budget
        self._buffer = bytearray()
        self._size = buffer_size
        self._binary = CappedBuffer(self)

    @property
    def buffer(self) -> CappedBuffer:  # type: ignore[override]
        """The binary stream underneath (write bytes here)."""
        return self._binary

    def writable(self) -> bool:
        """Always True."""
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The encoding of the bytes written (UTF-8)."""
        return "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        """How unencodable characters are written (as backslash escapes)."""
        return "backslashreplace"

    def fileno(self) -> int:
        """The underlying descriptor."""
        return self._fd

    def isatty(self) -> bool:
        """Never a terminal."""
        return False

    def write(self, s: str) -> int:
        """Buffer `s`; raise OutputLimitExceeded once the shared budget is spent."""
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self.write_bytes(s.encode("utf-8", "backslashreplace"))
        return len(s)

    def write_bytes(self, data: bytes) -> None:
        """Buffer raw bytes (the text side and `buffer` both end here), within the budget."""
        over = len(data) > self._budget.left
        if over:
            data = data[: max(self._budget.left, 0)]
        self._budget.left -= len(data)
        self._buffer += data
        if over or len(self._buffer) >= self._size:
            self.flush()
        if over:
            raise OutputLimitExceeded("output limit reached")

    def flush(self) -> None:
        """Write the buffer to the descriptor."""
        view = memoryview(bytes(self._buffer))
        self._buffer.clear()
        while view:
            n = os.write(self._fd, view)
            view = view[n:]


class CappedBuffer(io.BufferedIOBase):
    """The binary side of a `CappedStream` (`sys.stdout.buffer`): bytes in, same cap, same order."""

    def __init__(self, text: CappedStream) -> None:
        self._text = text

    def writable(self) -> bool:
        """Always True."""
        return True

    def fileno(self) -> int:
        """The underlying descriptor."""
        return self._text.fileno()

    def isatty(self) -> bool:
        """Never a terminal."""
        return False

    def write(self, b: Any) -> int:
        """Buffer bytes (any bytes-like object); raise OutputLimitExceeded past the cap."""
        if isinstance(b, str):
            raise TypeError("a bytes-like object is required, not 'str'")
        data = bytes(memoryview(b))
        self._text.write_bytes(data)
        return len(data)

    def flush(self) -> None:
        """Write what is buffered (shared with the text side) to the descriptor."""
        self._text.flush()


def _user_traceback(exc: BaseException) -> str:
    """The traceback without the runner's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _compile(code: str, filename: str) -> tuple[Any, Any]:
    """Compile a cell into (statements, trailing expression or None)."""
    tree = ast.parse(code, filename, "exec")
    expr = None
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr):
        tree.body.pop()
        expr = compile(ast.Expression(last.value), filename, "eval")
    return compile(tree, filename, "exec"), expr


def run_cell(
    code: str, namespace: dict[str, Any], cell_no: int, limits: SandboxLimits
) -> dict[str, Any]:
    """Run one cell in `namespace`; return {"status", "value", "message"} for the supervisor."""
    filename = f"<cell {cell_no}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    value: str | None = None
    try:
        body, expr = _compile(code, filename)
        exec(body, namespace)
        if expr is not None:
            result = eval(expr, namespace)
            if result is not None:
                text = repr(result)
                cap = int(limits.max_value_chars)
                value = (
                    text
                    if len(text) <= cap
                    else text[:cap] + f"... [{len(text) - cap} more characters]"
                )
        return {"status": "ok", "value": value, "message": ""}
    except SystemExit as exc:
        if exc.code in (None, 0):
            return {"status": "ok", "value": None, "message": ""}
        return _failure("error", f"SystemExit: {exc.code}", exc)
    except OutputLimitExceeded:
        cap = limits.max_output_bytes
        return {
            "status": "output_limit",
            "value": None,
            "message": f"output passed the {cap}-byte limit",
        }
    except MemoryError as exc:
        msg = f"MemoryError: the code needed more than the {limits.memory_mb} MB memory limit"
        return _failure("memory", msg, exc)
    except SyntaxError as exc:
        text = "".join(traceback.format_exception_only(type(exc), exc))
        return _failure("error", text.strip().splitlines()[-1], exc, text)
    except BaseException as exc:  # noqa: BLE001 - the model's code may raise anything
        return _failure("error", f"{type(exc).__name__}: {exc}", exc)


def _failure(
    status: str, message: str, exc: BaseException, text: str | None = None
) -> dict[str, Any]:
    """Write the traceback to stderr (within the cap) and build the result."""
    try:
        sys.stderr.write(text if text is not None else _user_traceback(exc))
    except OutputLimitExceeded:
        pass
    except MemoryError:
        message += " (traceback too large to print)"
    return {"status": status, "value": None, "message": message[:2000]}


def _make_streams(limits: SandboxLimits) -> dict[str, Any]:
    """Fresh stdio objects on descriptors 0-2 sharing one output budget."""
    budget = _Budget(int(limits.max_output_bytes))
    return {
        "stdin": io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8"),
        "stdout": CappedStream(1, budget),
        "stderr": CappedStream(2, budget, buffer_size=0),
    }


_prepared: dict[str, Any] | None = None


def prepare_streams(limits: SandboxLimits) -> None:
    """Build the first cell's stdio objects now, in the process that forks the children.

    Each child then starts with them in place: building them in the child (codec lookup, a
    TextIOWrapper, two stream objects) wrote ~80 pages of the shared heap, each a copy. Only
    the first cell uses them, so every cell still starts with untouched streams.
    """
    global _prepared
    _prepared = _make_streams(limits)


def _install_streams(limits: SandboxLimits, first: bool = False) -> None:
    """Install fresh stdio objects (the prepared ones for a child's first cell)."""
    streams = _prepared if first and _prepared is not None else _make_streams(limits)
    for name, stream in streams.items():
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _flush_streams(result: dict[str, Any], limits: SandboxLimits) -> None:
    """Write what the cell left buffered; a write that fails is reported, never dropped silently."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            stream.flush()
        except OutputLimitExceeded:
            result.update(
                status="output_limit",
                message=f"output passed the {limits.max_output_bytes}-byte limit",
            )
        except (OSError, ValueError) as exc:  # e.g. the code closed descriptor 1
            if result["status"] == "ok":
                result["status"] = "error"
            note = f"{name} could not be written ({type(exc).__name__}: {exc}); output was lost"
            result["message"] = (result["message"] + "; " if result["message"] else "") + note


def serve(
    limits: SandboxLimits, persistent: bool, res_fd: int = RESULT_FD, ctl_fd: int = CONTROL_FD
) -> None:
    """Answer cell requests from `ctl_fd` until end of file (one request when not persistent).

    Each request is a frame {"code", "cpu_seconds"}; each answer a frame on `res_fd`. A stateless
    child lowers its CPU-time limit to the request's before running the code, then exits. The
    first frame, {"ready": true}, is written before any code runs: a child that dies without
    it failed during set-up (the sandbox's fault); one that dies after it, the code's.
    """
    os.write(res_fd, READY_FRAME)  # 19 bytes to a fresh pipe: never a partial write
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    cell_no = 0
    while True:
        request = proto.read_frame(ctl_fd)
        if request is None:
            os._exit(0)
        cell_no += 1
        if not persistent:
            cpu = int(request["cpu_seconds"])
            used = resource.getrusage(resource.RUSAGE_SELF)
            cpu += int(used.ru_utime + used.ru_stime)
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        proto.reap_children()
        _install_streams(limits, first=cell_no == 1)
        result = run_cell(request["code"], namespace, cell_no, limits)
        _flush_streams(result, limits)
        proto.reap_children()
        proto.write_frame(res_fd, result)
        if not persistent:
            os._exit(0)
