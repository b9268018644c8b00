"""`looprl view`: a local, read-only web page with a run's curves, rollouts and token masks."""

from looprl.viewer.server import ViewerServer, build_parser, main_args, serve, start_server

__all__ = ["ViewerServer", "build_parser", "main_args", "serve", "start_server"]
