"""Find a run's tokenizer (offline only) and turn token ids into one display string per token.

A run directory is data, not instructions: a path its files name is followed only when it lies
inside the directories given to `looprl view` (the run's own `final/` and checkpoints included,
symlinks resolved), never to `/etc` or `../../x` elsewhere. Model names (looprl's built-in ones,
a hub id in the local Hugging Face cache) and the `--tokenizer` the user passed are used as they
are. A path not followed leaves the token view off, with a note that says so.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from looprl.viewer.schema import read_json

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # org/name, as the hub writes ids
_MODEL_KEYS = ("model", "model_name", "model_path", "name_or_path", "path", "name", "tokenizer")


class Decoder(Protocol):
    """What the viewer needs from a tokenizer."""

    def decode(self, ids: list[int], /) -> str:
        """Text of a list of token ids."""
        ...


def model_candidates(run_path: Path) -> list[str]:
    """Where the run's tokenizer may live, best first.

    The run's own exported model (`final/`), then its newest checkpoint directory holding
    tokenizer files (both are exact copies and need no model resolution), then any `model`-like
    key of `config.json` and `metadata.json` (a string, or a table with `name` / `path` /
    `tokenizer`). Relative paths among those are resolved by `_resolve`.
    """
    out: list[str] = []
    if _has_tokenizer_files(run_path / "final"):
        out.append(str(run_path / "final"))
    ckpts = run_path / "checkpoints"
    if ckpts.is_dir():
        dirs = sorted((d for d in ckpts.iterdir() if d.is_dir()), reverse=True)
        out += [str(d) for d in dirs if _has_tokenizer_files(d)][:1]
    for name in ("config.json", "metadata.json"):
        doc = read_json(run_path / name)
        if isinstance(doc, dict):
            _collect(doc, out, depth=0)
    return list(dict.fromkeys(out))


def _collect(doc: dict[str, Any], out: list[str], depth: int) -> None:
    for key in _MODEL_KEYS:
        v = doc.get(key)
        if isinstance(v, str) and v:
            out.append(v)
        elif isinstance(v, dict) and depth < 2:
            _collect(v, out, depth + 1)
    cfg = doc.get("config")
    if isinstance(cfg, dict) and depth < 2:
        _collect(cfg, out, depth + 1)


def _has_tokenizer_files(d: Path) -> bool:
    return (d / "tokenizer.json").is_file() or (d / "tokenizer_config.json").is_file()


def local_dir(name: str, run_path: Path) -> Path | None:
    """The directory a model path in a run's files names, wherever `looprl view` was started.

    A relative path was written relative to the directory training was started from, which is
    usually the run directory or one of its parents (`runs/demo/sft` beside `runs/demo/grpo`), so
    it is tried as given (the current directory), then against the run directory and each parent.
    """
    p = Path(name).expanduser()
    if p.is_absolute() or p.is_dir():
        return p if p.is_dir() else None
    for base in (run_path, *run_path.parents):
        if (base / p).is_dir():
            return base / p
    return None


def inside(path: Path, roots: Sequence[Path]) -> bool:
    """Whether `path`, symlinks resolved, lies in one of `roots` (resolved too)."""
    real = path.resolve()
    return any(real.is_relative_to(root.resolve()) for root in roots)


def _resolve(name: str, run_path: Path, roots: Sequence[Path]) -> tuple[Path | None, str]:
    """(local directory for `name`, a run's model name, or None and why not). A path outside
    `roots` is not followed; a name that is neither a path there nor a model name is refused."""
    from looprl.models.loading import BUILTIN_MODELS, resolve_model_path

    builtin = name.strip().lower() in BUILTIN_MODELS
    found = None if builtin else local_dir(name, run_path)
    if found is not None and not inside(found, roots):
        return None, (
            f"{name}: a path outside the viewed directories, not followed (pass --tokenizer "
            f"{name} to use it)"
        )
    if found is not None:
        return found, ""
    if not builtin and not _HUB_ID.match(name):
        return None, f"{name}: not a directory in the viewed directories nor a model name"
    try:  # looprl's own model names ("tiny", embedded models) and the hub cache, offline
        resolved = Path(resolve_model_path(name))
    except Exception as e:  # any failure only means "show ids"; the reason is shown in the page
        return None, (
            f"{name}: not a directory here, beside the run or above it, and not a looprl model "
            f"name ({type(e).__name__}: {e})"
        )
    if not resolved.is_dir():
        return None, f"{name}: resolved to {resolved}, which is not a directory"
    return resolved, ""


class FastDecoder:
    """A `tokenizers.Tokenizer` read straight from `tokenizer.json` (fast to load)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens included."""
        return str(self._tok.decode(ids, skip_special_tokens=False))


class HFDecoder:
    """A transformers tokenizer (for directories without `tokenizer.json`, e.g. SentencePiece)."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens included."""
        return str(self._tok.decode(ids, skip_special_tokens=False))


def _open_tokenizer(path: Path) -> Decoder:
    """`tokenizer.json` through `tokenizers` when present (0.1 s), else transformers (seconds)."""
    if (path / "tokenizer.json").is_file():
        return FastDecoder(path / "tokenizer.json")
    return HFDecoder(path)


def load_tokenizer(
    run_path: Path, roots: Sequence[Path] = (), user: str | None = None
) -> tuple[Decoder | None, str]:
    """(tokenizer or None, a line saying where it came from or why none was found).

    `user` (`--tokenizer`: a directory or a model name) is tried first and trusted; the run's
    own candidates (`model_candidates`) are followed only inside `run_path` and `roots` (the
    directories given to `looprl view`), as the module doc says.
    """
    if user:
        return _load_user(user)
    candidates = model_candidates(run_path)
    if not candidates:
        return None, "no model named in config.json / metadata.json; showing token ids"
    reasons = []
    for name in candidates:
        path, why = _resolve(name, run_path, [run_path, *roots])
        if path is None:
            reasons.append(why)
            continue
        try:
            tok = _open_tokenizer(path)
        except Exception as e:  # a broken tokenizer only means "show ids"; the reason is shown
            reasons.append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        return tok, f"tokenizer from {path}"
    return None, "no tokenizer could be loaded (" + "; ".join(reasons) + "); showing token ids"


def _load_user(name: str) -> tuple[Decoder | None, str]:
    """The tokenizer of `--tokenizer NAME` (a directory or a model name), or None and why."""
    from looprl.models.loading import resolve_model_path

    try:
        path = Path(name).expanduser()
        path = path if path.is_dir() else Path(resolve_model_path(name))
        return _open_tokenizer(path), f"tokenizer from --tokenizer {path}"
    except Exception as e:  # any failure only means "show ids"; the reason is shown in the page
        return None, f"--tokenizer {name}: {type(e).__name__}: {str(e)[:200]}; showing token ids"


class TokenizerCache:
    """One tokenizer per run directory, loaded on first use, plus a per-id string cache.

    `roots` are the directories given to `looprl view` and `user` its `--tokenizer`, passed on
    to `load_tokenizer`.
    """

    def __init__(self, roots: Sequence[Path] = (), user: str | None = None) -> None:
        self.roots = list(roots)
        self.user = user
        self._lock = threading.Lock()
        self._tok: dict[Path, tuple[Decoder | None, str]] = {}
        self._pieces: dict[Path, dict[int, str]] = {}

    def pieces(self, run_path: Path, ids: list[int]) -> tuple[list[str] | None, str]:
        """(one string per token id, or None without a tokenizer; where the tokenizer came from)."""
        with self._lock:
            if run_path not in self._tok:
                self._tok[run_path] = load_tokenizer(run_path, self.roots, self.user)
                self._pieces[run_path] = {}
            tok, note = self._tok[run_path]
            cache = self._pieces[run_path]
        if tok is None:
            return None, note
        out = []
        for i in ids:
            s = cache.get(i)
            if s is None:
                s = cache[i] = _piece(tok, i)
            out.append(s)
        return out, note


def _piece(tok: Decoder, i: int) -> str:
    """The text of token `i`, or `[i]` when the tokenizer cannot decode it (an id out of range)."""
    try:
        return tok.decode([i])
    except (OverflowError, ValueError, IndexError, KeyError, TypeError):
        return f"[{i}]"
