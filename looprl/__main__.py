"""`python -m looprl` (and `torchrun -m looprl train CONFIG`): the `looprl` command line."""

import sys

from looprl.cli.main import main

sys.exit(main())
