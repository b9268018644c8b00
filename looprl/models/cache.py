"""The looprl model cache: where built and converted models live, and atomic directory builds."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """The cache directory: `$LOOPRL_CACHE` when set, else `~/.cache/looprl`."""
    env = os.environ.get("LOOPRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "looprl"


def build_atomically(target: Path, build: Callable[[Path], object]) -> Path:
    """Return `target`, first creating it with `build(tmp_dir)` when it does not exist.

    `build` writes into a fresh temporary directory beside `target`, which is then renamed to
    `target`, so a killed build never leaves a half-written model behind and two processes
    building at once both end up with one complete directory.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like any model folder
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
