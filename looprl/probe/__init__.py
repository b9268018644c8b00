"""`looprl probe`: attack an environment's rubric with scripted exploits before training on it.

`run_probe(env, env_name=...)` runs the honest-failure baseline, the reference and every exploit
through the real rollout and returns the table; `looprl probe ENV` prints it and writes
`probe.json` beside the episodes. Environments add exploits with `env.probe_profile`.
"""

from looprl.probe.exploits import GENERIC
from looprl.probe.policy import Exploit, ProbeProfile, Turn, tool_call_text
from looprl.probe.run import ProbeResult, run_probe

__all__ = [
    "GENERIC",
    "Exploit",
    "ProbeProfile",
    "ProbeResult",
    "Turn",
    "run_probe",
    "tool_call_text",
]
