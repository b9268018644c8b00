"""`python -m looprl.viewer PATH...`: the same as `looprl view PATH...`."""

import sys

from looprl.viewer.server import main_args

if __name__ == "__main__":
    sys.exit(main_args(sys.argv[1:]))
