"""`looprl train` under torchrun with rank 1 failing before step 2's update (for test_distributed).

Usage: torchrun --nproc-per-node 2 tests/envs/dist_fault.py {die,hang} train ARGS...
`die` ends rank 1 at once (exit code 3); `hang` leaves it asleep, so rank 0 waits in a collective.
"""

from __future__ import annotations

import os
import sys
import time

from looprl.cli import main
from looprl.trainer.trainer import Trainer

MODE = sys.argv.pop(1)
_update = Trainer._update


def _faulty_update(self: Trainer, groups: list) -> dict[str, float]:
    if self.dist is not None and self.dist.rank == 1 and self.step == 1:
        print(f"dist_fault: rank 1 will {MODE} now", flush=True)
        if MODE == "die":
            os._exit(3)
        time.sleep(3600)
    return _update(self, groups)


Trainer._update = _faulty_update  # type: ignore[method-assign]
sys.exit(main())
