"""Length-prefixed JSON frames: the wire format between the pool, its workers and sandbox children.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. Standard
library only, because workers import it before anything else.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024


def reap_children() -> None:
    """Collect every exited child of this process without blocking: the code's own forks (they
    count against the process limit) and orphans re-parented to a worker."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


class ProtocolError(Exception):
    """A peer sent something that is not a valid frame."""


def encode(obj: Any) -> bytes:
    """One frame holding `obj` as JSON."""
    body = json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return HEADER.pack(len(body)) + body


def write_frame(fd: int, obj: Any) -> None:
    """Write a whole frame to a blocking file descriptor."""
    data = memoryview(encode(obj))
    while data:
        n = os.write(fd, data)
        data = data[n:]


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any:
    """Read one frame from a blocking descriptor; None at end of file."""
    head = _read_exact(fd, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds the {MAX_FRAME}-byte limit")
    body = _read_exact(fd, size)
    if body is None:
        return None
    return decode_body(body)


def decode_body(body: bytes) -> Any:
    """Parse a frame body; ProtocolError if it is not JSON."""
    try:
        return json.loads(body.decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from exc


class FrameBuffer:
    """Incremental frame parser for non-blocking reads: `feed(bytes)` returns complete frames."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """Add bytes; return every frame now complete (ProtocolError on an oversized frame)."""
        self._buf += data
        frames = []
        while len(self._buf) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buf)
            if size > self.max_frame:
                raise ProtocolError(
                    f"frame of {size} bytes exceeds the {self.max_frame}-byte limit"
                )
            if len(self._buf) < HEADER.size + size:
                break
            body = bytes(self._buf[HEADER.size : HEADER.size + size])
            del self._buf[: HEADER.size + size]
            frames.append(decode_body(body))
        return frames
