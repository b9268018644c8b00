"""Runs a vLLM server so that it cannot outlive the process that started it (stdlib only).

    python vllm_shim.py -- python -m vllm.entrypoints.openai.api_server ARGS...

The shim asks the kernel for SIGTERM when its parent (the trainer) dies, for any reason
including SIGKILL (`PR_SET_PDEATHSIG`), and runs vLLM in its own process group, which vLLM's
engine and worker processes inherit. On that signal, or on SIGTERM/SIGINT from `VLLMServer.stop`,
it kills the whole group. It runs under the vLLM venv's python and imports nothing from looprl.
`die_with_parent` is also how `looprl train --nproc N` ties torchrun to the launcher and each
rank to torchrun (`looprl.cli.torchrun`).
"""

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
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
    if not die_with_parent(signal.SIGTERM, os.getppid()):
        return 1
    cmd = sys.argv[sys.argv.index("--") + 1 :]
    child = subprocess.Popen(cmd)

    def kill_group(signum: int, frame: object) -> None:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # vLLM's processes and this shim

    signal.signal(signal.SIGTERM, kill_group)
    signal.signal(signal.SIGINT, kill_group)
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
