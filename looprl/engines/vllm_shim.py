"""Runs a vLLM server so that it cannot outlive the process that started it (stdlib only).

    python vllm_shim.py [--remove-if-orphaned PATH]... -- python -m vllm.entrypoints.openai.api_server ARGS...

The shim runs vLLM in its own process group, which vLLM's engine and worker processes inherit,
and kills the whole group on SIGTERM/SIGINT from `VLLMServer.stop` or when its parent (the
trainer) dies for any reason including SIGKILL. It tells that death by its own parent process
id changing, checked on the kernel's parent-death signal (SIGUSR1) and every `POLL_S`: the
signal alone does not tell, since it comes when the thread that started the shim ends, and a
SIGKILLed trainer's threads end one by one, so the shim may still be the child of the dying
trainer's last thread then. Once orphaned it first removes each `--remove-if-orphaned` path:
the trainer's model export and weights in RAM, and the server log of a server that never
failed. It runs under the vLLM venv's python and imports nothing from looprl. `die_with_parent`
is also how `looprl train --nproc N` ties torchrun to the launcher and each rank to torchrun
(`looprl.cli.torchrun`).
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
POLL_S = 0.2  # how often the shim checks that its parent still lives


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


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up once: safe to call after a fork


def die_with_parent(sig: int, parent: int) -> bool:
    """Have the kernel send `sig` to this process when its parent dies (Linux `PR_SET_PDEATHSIG`).

    `parent` is the PID the caller expects as its parent, read before the request: False when
    the parent is another by the time the request took effect (it died first: no signal will
    come), so the caller exits itself. Safe in a `preexec_fn` (no lookup, no allocation).
    """
    _prctl(PR_SET_PDEATHSIG, sig)
    return os.getppid() == parent


def main() -> int:
    """Start the command after `--` and wait for it; kill its whole group when told or orphaned."""
    parent = os.getppid()
    paths = orphan_paths(sys.argv)

    def kill_group(signum: int = 0, frame: object = None) -> None:
        if os.getppid() != parent:  # the trainer died: nobody else will remove its files
            for path in paths:
                remove(path)
        os.killpg(os.getpgrp(), signal.SIGKILL)  # vLLM's processes and this shim

    def kill_group_if_orphaned(signum: int = 0, frame: object = None) -> None:
        if os.getppid() != parent:
            kill_group()

    signal.signal(signal.SIGTERM, kill_group)
    signal.signal(signal.SIGINT, kill_group)
    signal.signal(signal.SIGUSR1, kill_group_if_orphaned)
    if not die_with_parent(signal.SIGUSR1, parent):  # the parent died before the request
        for path in paths:
            remove(path)
        return 1
    child = subprocess.Popen(sys.argv[sys.argv.index("--") + 1 :])
    while True:
        try:
            return child.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            kill_group_if_orphaned()


if __name__ == "__main__":
    sys.exit(main())
