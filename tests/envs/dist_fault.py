"""`looprl train` under torchrun with rank 1 failing before step 2's update (for test_distributed).

Usage: torchrun --nproc-per-node 2 tests/envs/dist_fault.py {die,hang,stop} train ARGS...
`die` ends rank 1 at once (exit code 3); `hang` leaves it asleep, so rank 0 waits in a collective;
`stop` ends every rank before step 3's update (exit code 5), as a job killed after step 2.
"""

from __future__ import annotations

import os
import sys
import time

from looprl.cli.main import main
from looprl.trainer.trainer import Trainer

MODE = sys.argv.pop(1)
_update = Trainer._update


def _faulty_update(self: Trainer, groups: list) -> dict[str, float]:
    if MODE == "stop" and self.step == 2:
        print("dist_fault: every rank stops now", flush=True)
        os._exit(5)
    if MODE != "stop" and self.dist is not None and self.dist.rank == 1 and self.step == 1:
        print(f"dist_fault: rank 1 will {MODE} now", flush=True)
        if MODE == "die":
            os._exit(3)
        time.sleep(3600)
    return _update(self, groups)


Trainer._update = _faulty_update  # type: ignore[method-assign]
sys.exit(main())
