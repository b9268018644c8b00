"""Isolated virtual environments for peer frameworks, so their pins never touch looprl's.

Each peer gets `benchmarks/.venvs/NAME`, created on first use with the CPU build of torch pinned
first (an unpinned torch pulls a multi-GB CUDA build) and then the peer's packages at the stated
versions. A stamp file records what was installed; a changed requirement list reinstalls.

    python = ensure_venv("trl", ["trl==0.19.1"])   # -> Path to that venv's python
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

VENVS = Path(__file__).parent / ".venvs"
TORCH = "torch==2.13.0"  # the CPU wheel this machine carries; keep in step with the Makefile


def ensure_venv(name: str, requirements: list[str], *, torch: bool = True) -> Path:
    """Create (once) and return the python of an isolated venv holding `requirements`.

    Raises SystemExit naming the failed step and its output if pip cannot install them.
    """
    root = VENVS / name
    python = root / "bin" / "python"
    wanted = ([TORCH] if torch else []) + list(requirements)
    stamp = root / ".looprl-stamp.json"
    digest = hashlib.sha256(json.dumps(wanted).encode()).hexdigest()
    if stamp.exists() and json.loads(stamp.read_text()).get("digest") == digest:
        return python
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(root)], f"creating {root}")
    _run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], "upgrading pip")
    if torch:
        _run([str(python), "-m", "pip", "install", "--quiet", TORCH], f"installing {TORCH}")
    _run(
        [str(python), "-m", "pip", "install", "--quiet", *wanted],
        f"installing {' '.join(requirements)}",
    )
    stamp.write_text(json.dumps({"digest": digest, "requirements": wanted}, indent=2))
    return python


def installed_versions(python: Path, packages: list[str]) -> dict[str, str]:
    """The versions of `packages` inside the venv of `python` ("missing" when absent)."""
    code = (
        "import json, importlib.metadata as m\n"
        "out = {}\n"
        f"for p in {packages!r}:\n"
        "    try: out[p] = m.version(p)\n"
        "    except m.PackageNotFoundError: out[p] = 'missing'\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _run(cmd: list[str], what: str) -> None:
    """Run a set-up command; on failure exit with what failed and the tail of its output."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"peer set-up failed while {what} (exit {done.returncode}):\n{tail}")
