"""Files: atomic writes (a kill leaves the old or the new, never half), JSONL, importing a .py file."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any


def write_text_atomically(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to a temporary file beside `path`, fsync it, then rename it over `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


# the name JSON gives each type `json.loads` returns besides dict (an object)
_JSON_KINDS: dict[type, str] = {
    list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"
}  # fmt: skip


def iter_jsonl(
    path: str | Path, *, fix: str = "each line must be one JSON object"
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL file, read one line at a time.

    A line that is not UTF-8, not JSON or not a JSON object raises ValueError naming the file
    and the line, followed by `fix` (what a line must hold, or what to do). Lines end at "\\n"
    only: a JSON string may hold U+2028, where `str.splitlines` would cut it. A missing file
    raises FileNotFoundError.
    """
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{path}:{n}: not UTF-8 (byte {exc.start} of the line); save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg}); {fix}") from None
            if not isinstance(row, dict):
                kind = _JSON_KINDS[type(row)]
                raise ValueError(f"{path}:{n}: a JSON {kind}, not an object; {fix}")
            yield n, row


def import_module_or_file(target: str) -> ModuleType:
    """Import `target`: a `.py` file (as a module named after the file, not put in `sys.modules`)
    or a module path (`my_pkg.my_env`; `-` read as `_`, as pip names packages).

    Raises FileNotFoundError for a `.py` path that is not a file and ModuleNotFoundError for a
    module that cannot be found (or that imports one that cannot): each caller says which flag or
    argument to fix.
    """
    if not target.endswith(".py"):
        return importlib.import_module(target.replace("-", "_"))
    path = Path(target)
    if not path.is_file():
        raise FileNotFoundError(f"no file {target}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"{target} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
