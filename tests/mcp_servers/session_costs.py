"""Measure what MCP sessions cost: start, one call, and a session per episode, over stdio and HTTP.

    OMP_NUM_THREADS=1 python tests/mcp_servers/session_costs.py [--episodes 10] [--calls 50]

Starts tests/mcp_servers/notes_server.py itself (over stdio, and over HTTP on a free 127.0.0.1
port), prints one line per transport, and stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from looprl.mcp import MCPServer, MCPTools
from looprl.tools.executor import ToolExecutor
from looprl.types import ToolCall

SERVER = str(Path(__file__).with_name("notes_server.py"))


def _http_server() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, SERVER, "--http", str(port)], stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the HTTP test server did not start") from None
            time.sleep(0.1)


async def _costs(
    tools: MCPTools, episodic: MCPTools, episodes: int, calls: int
) -> dict[str, float]:
    executor = ToolExecutor(tools.tools)
    call = [ToolCall(id="c", name="add", arguments={"a": 1, "b": 2})]
    start = time.perf_counter()
    for _ in range(calls):
        await executor.run(call, {})
    one_call = (time.perf_counter() - start) / calls
    start = time.perf_counter()
    await executor.run(call * 32, {})
    batch = time.perf_counter() - start
    per_episode = []
    for _ in range(episodes):
        start = time.perf_counter()
        await episodic.close_episode(await episodic.open_episode())
        per_episode.append(time.perf_counter() - start)
    return {"call_ms": 1e3 * one_call, "32_calls_ms": 1e3 * batch,
            "episode_session_ms": 1e3 * statistics.median(per_episode)}  # fmt: skip


def measure(server: MCPServer, episodes: int, calls: int) -> str:
    """One transport's line: environment start, one call, 32 concurrent calls, an episode session."""
    start = time.perf_counter()
    with MCPTools([server]) as tools:
        started = time.perf_counter() - start
        episodic_server = MCPServer(**{**vars(server), "per_episode": True})
        with MCPTools([episodic_server]) as episodic:
            costs = asyncio.run(_costs(tools, episodic, episodes, calls))
    shown = ", ".join(f"{k} {v:.1f}" for k, v in costs.items())
    return f"start_ms {1e3 * started:.0f}, {shown}"


def main() -> None:
    """Print the costs over stdio and over HTTP."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    print("stdio:", measure(MCPServer(command=[sys.executable, SERVER]), args.episodes, args.calls))
    proc, url = _http_server()
    try:
        print("http: ", measure(MCPServer(url=url), args.episodes, args.calls))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
