"""The `looprl` command line and its helpers: one module per command, the demo, the scaffold."""

from looprl.cli.main import main

__all__ = ["main"]
