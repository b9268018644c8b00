"""Runs a vLLM server so that it cannot outlive the process that started it (stdlib only).

    python vllm_shim.py -- python -m vllm.entrypoints.openai.api_server ARGS...

The shim asks the kernel for SIGTERM when its parent (the trainer) dies, for any reason
including SIGKILL (`PR_SET_PDEATHSIG`), and runs vLLM in its own process group, which vLLM's
engine and worker processes inherit. On that signal, or on SIGTERM/SIGINT from `VLLMServer.stop`,
it kills the whole group. It runs under the vLLM venv's python and imports nothing from looprl.
"""

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def main() -> int:
    """Start the command after `--` and wait for it; kill its whole group when told or orphaned."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request took effect
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
