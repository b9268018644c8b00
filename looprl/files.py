"""Files: atomic writes (a kill leaves the old or the new, never half), write faults named by
path (`writing`), JSONL, importing a .py file or a folder."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

WRITE_FAULTS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on device", "free space on that disk"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota"),
    errno.EROFS: ("read-only file system", "make it writable"),
}
"""The errors of a disk that takes no more data: errno -> (what happened, what to do)."""

# an errno in a message: Rust writers (safetensors) say `(os error 28)`, a copied OSError `[Errno 28]`
_ERRNO_TEXT = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")


class WriteFault(OSError):
    """A write refused by the disk (an errno of `WRITE_FAULTS`); `filename` is what was being
    written. Raised by `writing`; `looprl` turns it into one line (`write_fault_line`)."""


def write_fault(exc: BaseException) -> int | None:
    """The `WRITE_FAULTS` errno behind `exc`, or None: an `OSError`'s own errno, or one in its
    message (safetensors raises its own error type; a sharded checkpoint passes a rank's error on
    as text)."""
    if isinstance(exc, OSError) and exc.errno in WRITE_FAULTS:
        return exc.errno
    found = _ERRNO_TEXT.search(str(exc))
    code = int(found[1] or found[2]) if found else None
    return code if code in WRITE_FAULTS else None


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn a full disk, a quota or a read-only file system met inside into a `WriteFault` that
    names `path` (a `write` or `fsync` that fails names no file). Other errors pass unchanged, and
    so does a `WriteFault` raised by a `writing` inside (it names the more precise path)."""
    try:
        yield
    except WriteFault:
        raise
    except Exception as exc:
        code = write_fault(exc)
        if code is None:
            raise
        raise WriteFault(code, WRITE_FAULTS[code][0], str(path)) from exc


def write_fault_line(exc: BaseException, then: str) -> str | None:
    """The one-line error for a write the disk refused: the path, the fix, and `then` (how to
    go on, e.g. `rerun with --resume`); None for any other error."""
    code = write_fault(exc)
    if code is None:
        return None
    what, fix = WRITE_FAULTS[code]
    path = getattr(exc, "filename", None) or "a file"
    return f"error: {what} writing {path} — {fix}, then {then} (what was written before is intact)"


def write_text_atomically(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to a temporary file beside `path`, fsync it, then rename it over `path`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with writing(path):
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


class LineError(ValueError):
    """A line of a text file that cannot be read: `line` is its number, the message the problem,
    `fix` what to do about it ("" when the caller knows better)."""

    def __init__(self, line: int, problem: str, fix: str = "") -> None:
        super().__init__(problem)
        self.line = line
        self.fix = fix


def text_lines(f: BinaryIO, max_line_bytes: int | None = None) -> Iterator[str]:
    """The lines of the binary file `f` as UTF-8 text, ending at "\\n" only, each read no
    further than `max_line_bytes` (None: no limit); raises `LineError` for a longer line (after
    reading that much of it) or one that is not UTF-8."""
    size = -1 if max_line_bytes is None else max_line_bytes + 1
    for n, raw in enumerate(iter(lambda: f.readline(size), b""), 1):
        if max_line_bytes is not None and len(raw) > max_line_bytes and raw[-1:] != b"\n":
            raise LineError(n, f"longer than {byte_size(max_line_bytes)} (read no further)")
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LineError(
                n, f"not UTF-8 (byte {exc.start} of the line)", "save the file as UTF-8"
            ) from None


def iter_jsonl(
    path: str | Path,
    *,
    fix: str = "each line must be one JSON object",
    max_line_bytes: int | None = None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL file, read one line at a time.

    A line that is not UTF-8, not JSON or not a JSON object raises ValueError naming the file
    and the line, followed by `fix` (what a line must hold, or what to do). So does a line longer
    than `max_line_bytes` (None: no limit), found after reading at most that many bytes of it.
    Lines end at "\\n" only: a JSON string may hold U+2028, where `str.splitlines` would cut it.
    A missing file raises FileNotFoundError.
    """
    with open(path, "rb") as f:
        try:
            for n, line in enumerate(text_lines(f, max_line_bytes), 1):
                if line.strip():
                    yield n, _json_object(path, n, line, fix)
        except LineError as exc:
            raise ValueError(f"{path}:{exc.line}: {exc}; {exc.fix or fix}") from None


def _json_object(path: str | Path, n: int, line: str, fix: str) -> dict[str, Any]:
    """Line `n` of `path` as a JSON object, or ValueError naming the line and `fix`."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{n}: not valid JSON ({exc.msg}); {fix}") from None
    if not isinstance(row, dict):
        raise ValueError(f"{path}:{n}: a JSON {_JSON_KINDS[type(row)]}, not an object; {fix}")
    return row


def byte_size(n: int) -> str:
    """`n` bytes for a message: `16 MiB`, `1.5 KiB`, `200 bytes`."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def cut_torn_tail(path: str | Path) -> int:
    """Cut a last line that an interrupted append left half-written; the bytes cut (0: none).

    The last line counts as torn when it lacks its "\\n" and is not a complete JSON object; a
    complete one only gets its "\\n", so the next append starts a line of its own. Complete
    lines are never touched.
    """
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        start = _last_line_start(f, size)
        f.seek(start)
        try:
            complete = isinstance(json.loads(f.read()), dict)
        except ValueError:  # not JSON, or not UTF-8 (UnicodeDecodeError is a ValueError)
            complete = False
        if complete:
            f.write(b"\n")
            return 0
        f.truncate(start)
        return size - start


def _last_line_start(f: Any, size: int, chunk: int = 1 << 16) -> int:
    """The offset just after the last "\\n" of the open binary file `f` (0 when it has none)."""
    end = size
    while end > 0:
        begin = max(0, end - chunk)
        f.seek(begin)
        at = f.read(end - begin).rfind(b"\n")
        if at >= 0:
            return begin + at + 1
        end = begin
    return 0


FOLDER_MAIN_FILES = ("__init__.py", "environment.py", "{name}.py", "{name}_env.py")
"""The file a folder is imported as: the first of these it holds (`{name}`: the folder's name,
`-` read as `_`). A package; a file named for its role; the verifiers layout (`my_env/my_env.py`);
the `looprl init` layout (`my-env/my_env_env.py`)."""


def folder_main_file(folder: Path) -> Path:
    """The `FOLDER_MAIN_FILES` file `folder` holds; FileNotFoundError naming the choices."""
    name = folder.resolve().name.replace("-", "_")
    candidates = [pattern.format(name=name) for pattern in FOLDER_MAIN_FILES]
    for candidate in candidates:
        if (folder / candidate).is_file():
            return folder / candidate
    raise FileNotFoundError(
        f"folder {folder} holds none of {', '.join(candidates)}; give the path of its .py file"
    )


def import_module_or_file(target: str) -> ModuleType:
    """Import `target`: a `.py` file (as a module named after the file, not put in `sys.modules`),
    a folder that exists (its `folder_main_file`, as a file) or a module path (`my_pkg.my_env`;
    `-` read as `_`, as pip names packages).

    A file imports the files beside it while it runs, by name (`from helpers import score`) or
    relatively (`from .helpers import score`): see `_folder_package` and `_siblings_importable`.

    Raises FileNotFoundError for a `.py` path that is not a file or a folder without a main file
    and ModuleNotFoundError for a module that cannot be found (or that imports one that cannot):
    each caller says which flag or argument to fix.
    """
    if target and Path(target).is_dir():
        target = str(folder_main_file(Path(target)))
    if not target.endswith(".py"):
        return importlib.import_module(target.replace("-", "_"))
    path = Path(target)
    if not path.is_file():
        raise FileNotFoundError(f"no file {target}")
    folder = path.resolve().parent
    spec = importlib.util.spec_from_file_location(f"{_folder_package(folder)}.{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"{target} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    with _siblings_importable(folder):
        spec.loader.exec_module(module)
    return module


def _folder_package(folder: Path) -> str:
    """A package in `sys.modules` whose path is `folder`, named after its location
    (`_looprl_dir_<hash>`): a loaded file's relative imports find the files beside it there, and
    two folders with a `helpers.py` each never share one."""
    name = "_looprl_dir_" + hashlib.sha1(str(folder).encode()).hexdigest()[:12]
    if name not in sys.modules:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
    return name


def _sibling_names(folder: Path) -> set[str]:
    """The top-level names the files and packages in `folder` import as (the standard library's
    and `looprl`, which must stay the one the caller runs, left out)."""
    names = {p.stem for p in folder.glob("*.py")} | {
        p.name for p in folder.iterdir() if (p / "__init__.py").is_file()
    }
    return names - set(sys.stdlib_module_names) - {"looprl"}


@contextlib.contextmanager
def _siblings_importable(folder: Path) -> Iterator[None]:
    """While a file of `folder` runs, `import helpers` finds `folder/helpers.py`.

    `folder` goes first on `sys.path`, and modules imported from elsewhere under a sibling's
    name are set aside; afterwards `sys.path` is as before, the siblings imported meanwhile leave
    `sys.modules` (the loaded file keeps its references) and the set-aside modules come back.
    Modules already imported from `folder` itself stay (a file beside a `looprl/` checkout
    shares the one `looprl`). A sibling imported inside a function, after loading, is not
    found: import siblings at the top of the file, or relatively.
    """
    names = _sibling_names(folder)
    before = set(sys.modules)

    def ours(key: str) -> bool:
        return key.split(".")[0] in names

    def elsewhere(module: ModuleType) -> bool:
        file = getattr(module, "__file__", None)
        return file is None or folder not in Path(file).resolve().parents

    aside = [k for k in before if ours(k) and elsewhere(sys.modules[k])]
    saved = {key: sys.modules.pop(key) for key in aside}
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        sys.path.remove(entry)
        for key in [k for k in sys.modules if ours(k) and k not in before]:
            del sys.modules[key]
        sys.modules.update(saved)
