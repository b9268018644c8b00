"""The judge's cache: replies by key in a bounded LRU, kept across runs in an optional JSONL file.

Only replies that hold a score are kept (the judge passes `keep`, its score parser): a reply
the parser could not read is never cached, so a passing bad answer is asked again next time
instead of failing that judgement for good. Lines of an older file whose reply no longer
parses are skipped when the file is read.

The file is appended to, one line `{"key", "reply"}` a judgement. A kill during an append can
leave the last line cut short: it is cut off when the file is next read (with a warning naming
the file), so the next start neither fails nor appends after half a line. Every other problem
with the file raises `JudgeCacheError` naming the file and the fix.
"""

from __future__ import annotations

import json
import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from looprl.files import cut_torn_tail, iter_jsonl

_FIX = "delete the file or point cache_path elsewhere"
_LINE = "a judge cache line is {'key', 'reply'}; " + _FIX


class JudgeCacheError(ValueError):
    """The judge cache file cannot be read or written; the message names the file and the fix."""


class JudgeCache:
    """Judge replies by key: an LRU of `size` entries, and a JSONL file when `path` is given.

    The file is read at start (the last `size` entries whose reply `keep` accepts stay in
    memory; `skipped` counts those it did not) and each new reply is appended, so a restarted
    run asks no judgement twice. `keep` (default: every reply) says which replies may be kept.
    """

    def __init__(
        self,
        size: int = 4096,
        path: str | Path | None = None,
        keep: Callable[[str], bool] | None = None,
    ) -> None:
        if size < 0:
            raise ValueError(f"judge cache size must be >= 0 (0 turns it off), got {size}")
        self.size = size
        self.path = Path(path) if path else None
        self.keep = keep or (lambda reply: True)
        self.skipped = 0
        self._items: OrderedDict[str, str] = OrderedDict()
        if self.path is not None and self.path.exists():
            self._load(self.path)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> str | None:
        """The cached reply for `key` (marked as recently used), or None."""
        reply = self._items.get(key)
        if reply is not None:
            self._items.move_to_end(key)
        return reply

    def put(self, key: str, reply: str) -> bool:
        """Remember `reply` for `key` (in memory, and appended to the file when there is one)
        when `keep` accepts it; whether it was kept."""
        if not self.keep(reply):
            return False
        self._put(key, reply)
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "reply": reply}) + "\n")
            except OSError as exc:
                raise JudgeCacheError(
                    f"judge cache {self.path}: cannot append a judgement "
                    f"({exc.strerror or exc}); free disk space or fix its permissions, "
                    "or point cache_path elsewhere"
                ) from None
        return True

    def _load(self, path: Path) -> None:
        """Read the file: cut a torn last line, skip replies `keep` refuses, fail on the rest."""
        try:
            cut = cut_torn_tail(path)
            for n, row in iter_jsonl(path, fix=_LINE):
                self._read_row(path, n, row)
        except JudgeCacheError:
            raise
        except OSError as exc:
            raise JudgeCacheError(
                f"judge cache {path}: cannot read it ({exc.strerror or exc}); fix its "
                f"permissions, or {_FIX}"
            ) from None
        except ValueError as exc:  # iter_jsonl's, naming the file and the line
            raise JudgeCacheError(f"judge cache {exc}") from None
        if cut:
            warnings.warn(
                f"judge cache {path}: its last line was cut short ({cut} bytes, an interrupted "
                "write); dropped it, that judgement will be asked again",
                UserWarning,
                stacklevel=4,
            )

    def _read_row(self, path: Path, n: int, row: dict[str, Any]) -> None:
        """Keep one line of the file, or count it as skipped when `keep` refuses its reply."""
        key, reply = row.get("key"), row.get("reply")
        if not isinstance(key, str) or not isinstance(reply, str):
            raise JudgeCacheError(f"judge cache {path}:{n}: no string 'key' or 'reply'; {_LINE}")
        if self.keep(reply):
            self._put(key, reply)
        else:
            self.skipped += 1

    def _put(self, key: str, reply: str) -> None:
        if self.size == 0:
            return
        self._items[key] = reply
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)
