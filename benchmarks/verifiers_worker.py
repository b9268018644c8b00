"""The verifiers side of benchmarks/vs_verifiers.py: run calculator episodes, print one JSON line.

Runs inside the isolated verifiers venv (benchmarks/.venvs/verifiers), so it imports only
verifiers, datasets and the standard library, never the looprl package (its stdlib-only
`looprl/envs/arithmetic.py` is loaded by path for the tool). The environment is the classic
`vf.ToolEnv` (python functions as tools, OpenAI tool calling, a `vf.Rubric` of reward functions)
driven the way `vf-eval` drives it: `env.generate(..., client=vf.ClientConfig(...),
max_concurrent=C)`, with the progress bar and logging switched off (looprl's timed path has none).

    python benchmarks/verifiers_worker.py --base-url URL --tasks tasks.json --concurrency 32

Output (stdout, one line): framework, version, episodes, wall_s, cpu_s (user+sys of this
process over the timed call only), turns/tool_calls/reward summed over episodes, errors, and
rss_before_mib / peak_rss_mib of this process.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import logging
import re
import resource
import time
from pathlib import Path
from typing import Any

_ANSWER_RE = re.compile(r"answer is\s*(-?[\d,]+(?:\.\d+)?)", re.IGNORECASE)


def _load_arithmetic() -> Any:
    """looprl's stdlib-only evaluator, loaded by path: this venv has no looprl installed."""
    path = Path(__file__).parents[1] / "looprl" / "envs" / "arithmetic.py"
    spec = importlib.util.spec_from_file_location("looprl_arithmetic", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ARITH = _load_arithmetic()  # the same safe_eval / calculate as looprl's calculator tool


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression, e.g. (12 + 3) * 4.
    """
    return _ARITH.calculate(expression)


def correct_answer(completion: Any, answer: str, **kwargs: Any) -> float:
    """1.0 when the last assistant message says 'The answer is N' with the reference N."""
    text = ""
    for msg in completion:
        role = msg.get("role") if isinstance(msg, dict) else getattr(msg, "role", None)
        if role == "assistant":
            content = msg.get("content") if isinstance(msg, dict) else msg.content
            text = content or ""
    match = _ANSWER_RE.search(text)
    return float(match is not None and match.group(1).replace(",", "") == answer)


def build_env(tasks: list[dict[str, str]], system_prompt: str) -> Any:
    """A verifiers ToolEnv over `tasks` ({"question", "answer"} rows) with the calculate tool."""
    import verifiers as vf
    from datasets import Dataset

    dataset = Dataset.from_list([{"question": t["question"], "answer": t["answer"]} for t in tasks])
    rubric = vf.Rubric(funcs=[correct_answer], weights=[1.0])
    return vf.ToolEnv(
        dataset=dataset, tools=[calculate], rubric=rubric, system_prompt=system_prompt, max_turns=4
    )


async def run_episodes(env: Any, inputs: list[Any], base_url: str, concurrency: int) -> Any:
    """One `env.generate` over `inputs` against `base_url`, `concurrency` groups at a time."""
    import verifiers as vf

    def quiet(*args: Any, **kwargs: Any) -> None:
        return None

    config = vf.ClientConfig(api_base_url=base_url, api_key_var="VS_VERIFIERS_API_KEY")
    return await env.generate(
        inputs,
        client=config,
        model="fake-model",
        sampling_args={"max_tokens": 96, "temperature": 1.0},
        max_concurrent=concurrency,
        on_start=quiet,
        on_progress=quiet,
        on_log=quiet,
    )


def _rss_mib() -> float:
    """Current resident set size of this process in MiB (Linux /proc)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def _cpu_s() -> float:
    """User + system CPU seconds of this process so far (all its threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def summarize(outputs: list[Any]) -> dict[str, float]:
    """Turns, tool calls, reward and errors summed over the episodes' outputs."""
    metrics = [o.get("metrics") or {} for o in outputs]
    return {
        "turns": sum(float(m.get("num_turns", 0)) for m in metrics),
        "tool_calls": sum(float(m.get("total_tool_calls", 0)) for m in metrics),
        "reward": sum(float(o.get("reward") or 0.0) for o in outputs),
        "errors": sum(1 for o in outputs if o.get("error")),
    }


def main() -> None:
    """Parse arguments, warm up, time one `generate` call and print its figures as JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--tasks", required=True, help="JSON file: system_prompt and tasks")
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--warmup", type=int, default=8, help="untimed episodes run first")
    args = p.parse_args()
    logging.disable(logging.WARNING)  # verifiers logs each generate call at INFO
    spec = json.loads(Path(args.tasks).read_text())
    env = build_env(spec["tasks"], spec["system_prompt"])
    inputs = env.get_dataset().to_list()  # outside the timing, as looprl's task list is
    if args.warmup:
        asyncio.run(run_episodes(env, inputs[: args.warmup], args.base_url, args.concurrency))
    rss_before, cpu0, t0 = _rss_mib(), _cpu_s(), time.perf_counter()
    results = asyncio.run(run_episodes(env, inputs, args.base_url, args.concurrency))
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "framework": "verifiers",
        "version": importlib.metadata.version("verifiers"),
        "episodes": len(results["outputs"]),
        "wall_s": wall,
        "cpu_s": cpu,
        "rss_before_mib": rss_before,
        "peak_rss_mib": peak,
        **summarize(results["outputs"]),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
