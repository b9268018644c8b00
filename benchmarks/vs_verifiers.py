"""Environment machinery overhead, looprl vs verifiers: same calculator episodes, instant fake model.

    python -m benchmarks.vs_verifiers                    # concurrency 1, 32, 256; 3 pairs each
    python -m benchmarks.vs_verifiers --quick            # tiny budget (the smoke test)
    python -m benchmarks.vs_verifiers --no-install       # verifiers only if its venv exists

Both frameworks run the same multi-turn calculator episodes (system + "What is EXPR?", a
`calculate` tool, the exact-answer reward) against one scripted OpenAI-compatible server
(`looprl.testing.fake_openai`) in its own process on 127.0.0.1. The server answers at once:
turn 0 calls `calculate` with the task's expression, turn 1 replies "The answer is <tool
result>.", so every episode is 2 model calls + 1 tool call and costs the model nothing; only
the framework is measured. No model runs, so benchmarks/roofline.py has nothing to bound here.

Each run is a fresh worker process: looprl's (this file with `--worker`, driving
`looprl.eval.summary.evaluate` with `make_policy(..., base_url=...)` as `looprl eval --base-url`
does, minus the progress bar and results file) or verifiers' (benchmarks/verifiers_worker.py in
its own venv, `vf.ToolEnv` driven by `env.generate`, which `vf-eval` uses, minus the progress
bar and saving). A worker runs a few untimed episodes, then times one call over all episodes
and reports wall time, its own CPU time (user + sys, so the server is excluded) and its RSS.
Runs go in pairs, the order flipping each pair (A B, B A, ...), and every ratio is computed
within a pair. Figures are medians over pairs with [min - max].

verifiers is installed by `ensure_venv` into benchmarks/.venvs/verifiers at the version below
(0.1.14, the last 0.1.x release, whose classic `vf.ToolEnv` takes python functions as tools).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from looprl.testing.fake_openai import FakeOpenAIServer, FakeReply, count_assistant_turns

ROOT = Path(__file__).parents[1]
VERIFIERS_VERSION = "0.1.14"  # the last 0.1.x release on PyPI; has the classic vf.ToolEnv
VERIFIERS_REQUIREMENTS = [f"verifiers=={VERIFIERS_VERSION}"]  # pulls no torch
WORKER_TIMEOUT_S = 900
FRAMEWORKS = ("looprl", "verifiers")


@dataclass(frozen=True)
class Budget:
    """How much to run: concurrency levels, episodes per level, pairs per level, warm-up episodes."""

    concurrency: tuple[int, ...] = (1, 32, 256)
    episodes: tuple[int, ...] = (100, 512, 1024)
    pairs: int = 3
    warmup: int = 8


QUICK = Budget(concurrency=(1, 4), episodes=(6, 12), pairs=1, warmup=2)


# ----------------------------------------------------------------- the fake model


def calculator_script(request: dict[str, Any]) -> FakeReply:
    """Turn 0: call `calculate` on the question's expression; later turns: state the tool result."""
    messages = request.get("messages") or []
    if count_assistant_turns(request) == 0:
        question = next(m["content"] for m in reversed(messages) if m.get("role") == "user")
        expression = question.removeprefix("What is ").removesuffix("?")
        return FakeReply(
            tool_calls=[{"name": "calculate", "arguments": {"expression": expression}}]
        )
    result = next((m["content"] for m in reversed(messages) if m.get("role") == "tool"), "")
    return FakeReply(text=f"The answer is {result}.")


def serve() -> None:
    """Server mode: print the base URL, then serve until stdin closes (the parent ended)."""
    with FakeOpenAIServer(script=calculator_script) as server:
        print(server.base_url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            sys.stdin.read()


@dataclass(frozen=True)
class ServerProcess:
    """The running fake server: its base URL and process id."""

    url: str
    pid: int

    def cpu_s(self) -> float:
        """User + system CPU seconds the server process has used so far (Linux /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def fake_server() -> Iterator[ServerProcess]:
    """Run the fake server in its own process (its CPU is not the framework's); yield it."""
    cmd = [sys.executable, "-m", "benchmarks.vs_verifiers", "--serve"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http://127.0.0.1:"):
            raise SystemExit(f"the fake server did not start (printed {url!r})")
        yield ServerProcess(url, proc.pid)
    finally:
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ----------------------------------------------------------------- the looprl worker


def _cpu_s() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _rss_mib() -> float:
    """Current resident set size of this process in MiB (Linux /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


async def _looprl_episodes(base_url: str, tasks: list[Any], concurrency: int, env: Any) -> Any:
    """One `evaluate` over `tasks` with a fresh engine, `concurrency` episodes at a time."""
    from looprl.engines.factory import make_policy
    from looprl.eval.summary import evaluate
    from looprl.rollout.loop import RolloutConfig
    from looprl.types import SamplingParams

    policy = make_policy("fake-model", base_url=base_url, max_concurrency=concurrency)
    sampling = SamplingParams(max_tokens=env.limits.max_tokens_per_turn, temperature=1.0)
    try:
        episodes, _ = await evaluate(
            env,
            policy.engine,
            tasks,
            rollouts_per_task=1,
            renderer=None,
            config=RolloutConfig(sampling=sampling),
            max_concurrent_groups=concurrency,
        )
    finally:
        await policy.engine.close()
    return episodes


def looprl_worker(base_url: str, episodes: int, concurrency: int, warmup: int) -> dict[str, Any]:
    """Warm up, then time one looprl `evaluate` of `episodes` calculator episodes."""
    from looprl.envs.registry import load_environment

    env = load_environment("calculator")
    tasks = env.get_tasks("eval", episodes, seed=0)
    if warmup:
        asyncio.run(_looprl_episodes(base_url, tasks[:warmup], concurrency, env))
    rss_before, cpu0, t0 = _rss_mib(), _cpu_s(), time.perf_counter()
    results = asyncio.run(_looprl_episodes(base_url, tasks, concurrency, env))
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    return {
        "framework": "looprl",
        "episodes": len(results),
        "wall_s": wall,
        "cpu_s": cpu,
        "rss_before_mib": rss_before,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "turns": sum(ep.num_turns for ep in results),
        "tool_calls": sum(ep.num_tool_calls for ep in results),
        "reward": sum(ep.reward for ep in results),
        "errors": sum(bool(ep.errors) for ep in results),
    }


# ----------------------------------------------------------------- orchestration


def write_tasks(path: Path, n: int) -> None:
    """The calculator tasks both workers run, as the JSON the verifiers worker reads."""
    from looprl.envs.calculator import SYSTEM_PROMPT, generate_tasks

    tasks = [
        {"question": t.prompt[0].content, "answer": t.answer or ""}
        for t in generate_tasks("eval", n, seed=0)
    ]
    path.write_text(json.dumps({"system_prompt": SYSTEM_PROMPT, "tasks": tasks}))


def run_worker(cmd: list[str]) -> dict[str, Any]:
    """Run one worker process and parse the JSON line it prints last."""
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    if done.returncode != 0:
        raise SystemExit(f"worker {cmd[2:4]} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def worker_command(
    framework: str, python: Path | None, url: str, tasks: Path, n: int, c: int, warmup: int
) -> list[str]:
    """The command line of one run of `framework` (n episodes at concurrency c)."""
    common = ["--base-url", url, f"--concurrency={c}", f"--warmup={warmup}"]
    if framework == "looprl":
        return [
            sys.executable,
            "-m",
            "benchmarks.vs_verifiers",
            "--worker",
            f"--episodes={n}",
            *common,
        ]
    assert python is not None
    spec = json.loads(tasks.read_text())
    spec["tasks"] = spec["tasks"][:n]
    sliced = tasks.with_name(f"tasks-{n}.json")
    sliced.write_text(json.dumps(spec))
    script = str(ROOT / "benchmarks" / "verifiers_worker.py")
    return [str(python), script, "--tasks", str(sliced), *common]


def measure(budget: Budget, python: Path | None) -> dict[int, list[dict[str, dict[str, Any]]]]:
    """Every pair of runs per concurrency level: {c: [{framework: result}, ...]}."""
    frameworks = FRAMEWORKS if python is not None else FRAMEWORKS[:1]
    out: dict[int, list[dict[str, dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp, fake_server() as server:
        tasks = Path(tmp) / "tasks.json"
        write_tasks(tasks, max(budget.episodes))
        for c, n in zip(budget.concurrency, budget.episodes, strict=True):
            out[c] = []
            for i in range(budget.pairs):
                order = frameworks if i % 2 == 0 else frameworks[::-1]
                pair = {}
                for fw in order:
                    cmd = worker_command(fw, python, server.url, tasks, n, c, budget.warmup)
                    server_cpu0 = server.cpu_s()
                    r = pair[fw] = run_worker(cmd)
                    r["server_cpu_s"] = server.cpu_s() - server_cpu0
                    r["server_requests"] = r["turns"] + 2 * min(budget.warmup, n)
                    print(
                        f"  c={c:<4} pair {i + 1} {fw:<9} {r['episodes'] / r['wall_s']:8.1f} ep/s "
                        f"{1000 * r['cpu_s'] / max(1, r['turns']):6.2f} CPU ms/turn",
                        flush=True,
                    )
                out[c].append(pair)
    return out


# ----------------------------------------------------------------- report


def _stat(values: list[float], fmt: str) -> str:
    """`median [min - max]` of `values` in format `fmt`."""
    med = statistics.median(values)
    return f"{med:{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def _per_run(r: dict[str, Any]) -> dict[str, float]:
    """Derived figures of one run: episodes/s, CPU ms per turn, turns and tool calls per episode."""
    n = max(1, r["episodes"])
    return {
        "eps": r["episodes"] / r["wall_s"],
        "cpu_ms_turn": 1000 * r["cpu_s"] / max(1, r["turns"]),
        "cpu_ms_ep": 1000 * r["cpu_s"] / n,
        "turns_ep": r["turns"] / n,
        "tools_ep": r["tool_calls"] / n,
        "reward": r["reward"] / n,
        "peak": r["peak_rss_mib"],
        "growth": r["peak_rss_mib"] - r["rss_before_mib"],
        "server_ms": 1000 * r["server_cpu_s"] / max(1, r["server_requests"]),
        "errors": r["errors"],
    }


COLUMNS = (  # (header, per-run figure, format, width)
    ("episodes/s", "eps", ".1f", 20),
    ("CPU ms/turn", "cpu_ms_turn", ".2f", 20),
    ("CPU ms/episode", "cpu_ms_ep", ".2f", 20),
    ("peak RSS MiB", "peak", ".0f", 15),
    ("RSS growth MiB", "growth", ".0f", 15),
    ("server CPU ms/req", "server_ms", ".2f", 20),
)


def _row(c: int, fw: str, runs: list[dict[str, float]]) -> str:
    """One table row: medians [min-max] of each column, then per-episode work and errors."""
    cells = [f"{_stat([r[key] for r in runs], fmt):>{w}}" for _, key, fmt, w in COLUMNS]
    work = [statistics.median(r[k] for r in runs) for k in ("turns_ep", "tools_ep", "reward")]
    errors = sum(r["errors"] for r in runs)
    return (
        f"{c:>4} {fw:<9} "
        + " ".join(cells)
        + "".join(f" {x:>8.2f}" for x in work)
        + f" {errors:>6.0f}"
    )


def report(results: dict[int, list[dict[str, dict[str, Any]]]], pairs: int) -> None:
    """Print one row per framework and concurrency, then the pair-by-pair ratios."""
    print(f"\nmedian [min-max] over {pairs} pair(s) per row; a turn is one model call")
    heads = " ".join(f"{h:>{w}}" for h, _, _, w in COLUMNS)
    print(
        f"{'c':>4} {'framework':<9} {heads} {'turns/ep':>8} {'tools/ep':>8} {'reward':>8} {'errors':>6}"
    )
    for c, runs in results.items():
        for fw in runs[0]:
            print(_row(c, fw, [_per_run(pair[fw]) for pair in runs]))
    if all(len(runs[0]) == len(FRAMEWORKS) for runs in results.values()):
        print("\nratios within each pair, median [min-max]")
        print(f"{'c':>4} {'looprl/verifiers episodes/s':>30} {'verifiers/looprl CPU per turn':>32}")
        for c, runs in results.items():
            lo = [_per_run(pair["looprl"]) for pair in runs]
            vf = [_per_run(pair["verifiers"]) for pair in runs]
            speed = [a["eps"] / b["eps"] for a, b in zip(lo, vf, strict=True)]
            cpu = [b["cpu_ms_turn"] / a["cpu_ms_turn"] for a, b in zip(lo, vf, strict=True)]
            print(f"{c:>4} {_stat(speed, '.2f'):>30} {_stat(cpu, '.2f'):>32}")


def verifiers_python(install: bool) -> Path | None:
    """The verifiers venv's python: installed first when `install`, else only if already there."""
    from benchmarks.peer_venv import VENVS, ensure_venv, installed_versions

    if install:
        return ensure_venv("verifiers", VERIFIERS_REQUIREMENTS, torch=False)
    python = VENVS / "verifiers" / "bin" / "python"
    if (
        python.exists()
        and installed_versions(python, ["verifiers"])["verifiers"] == VERIFIERS_VERSION
    ):
        return python
    return None


def _machine() -> str:
    """Cores and load average, since other jobs on the machine skew wall-clock figures."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPU cores, load average {load} at start"


def main() -> None:
    """Parse arguments; serve, run one worker, or run the whole comparison."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny budget: c=1 and 4, a few episodes")
    p.add_argument("--pairs", type=int, default=None, help="looprl/verifiers pairs per level")
    p.add_argument(
        "--no-install", action="store_true", help="skip verifiers unless its venv exists"
    )
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    p.add_argument("--episodes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=8, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        return serve()
    if args.worker:
        print(
            json.dumps(looprl_worker(args.base_url, args.episodes, args.concurrency, args.warmup))
        )
        return None
    budget = QUICK if args.quick else Budget()
    if args.pairs:
        budget = Budget(budget.concurrency, budget.episodes, args.pairs, budget.warmup)
    python = verifiers_python(install=not args.no_install)
    if python is None:
        print("verifiers: skipped (its venv is not set up; run without --no-install to install it)")
    print(f"looprl (this checkout) vs verifiers {VERIFIERS_VERSION}, {budget}")
    print(f"{_machine()}; fake server in its own process on 127.0.0.1")
    results = measure(budget, python)
    report(results, budget.pairs)
    return None


if __name__ == "__main__":
    main()
