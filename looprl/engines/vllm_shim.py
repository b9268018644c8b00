"""Runs a vLLM server so that it cannot outlive the process that started it (stdlib only).

    python vllm_shim.py [--remove-if-orphaned PATH]... -- python -m vllm.entrypoints.openai.api_server ARGS...

The shim asks the kernel for SIGTERM when its parent (the trainer) dies, for any reason
including SIGKILL (`PR_SET_PDEATHSIG`), and runs vLLM in its own process group, which vLLM's
engine and worker processes inherit. On that signal, or on SIGTERM/SIGINT from `VLLMServer.stop`,
it kills the whole group. When the parent has died (its parent is no longer the one that started
it), it first removes each `--remove-if-orphaned` path: the trainer's model export and weights in
RAM, and the server log of a server that never failed. It runs under the vLLM venv's python and
imports nothing from looprl.
"""

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
REMOVE = "--remove-if-orphaned"


def orphan_paths(args: list[str]) -> list[str]:
    """The paths given as `--remove-if-orphaned PATH` before `--`."""
    head = args[: args.index("--")]
    return [head[i + 1] for i, arg in enumerate(head[:-1]) if arg == REMOVE]


def remove(path: str) -> None:
    """Remove a file or a directory tree; a path already gone is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def main() -> int:
    """Start the command after `--` and wait for it; kill its whole group when told or orphaned."""
    parent = os.getppid()
    paths = orphan_paths(sys.argv)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request took effect
        for path in paths:
            remove(path)
        return 1
    cmd = sys.argv[sys.argv.index("--") + 1 :]
    child = subprocess.Popen(cmd)

    def kill_group(signum: int, frame: object) -> None:
        if os.getppid() != parent:  # the trainer died: nobody else will remove its files
            for path in paths:
                remove(path)
        os.killpg(os.getpgrp(), signal.SIGKILL)  # vLLM's processes and this shim

    signal.signal(signal.SIGTERM, kill_group)
    signal.signal(signal.SIGINT, kill_group)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
