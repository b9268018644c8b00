"""Seconds per GRPO step end to end, `engine.kind` torch against vllm, on the same model and env.

Each side runs `--steps` GRPO steps of `--tasks` x `--rollouts` episodes through `Trainer`, the
code `looprl train` runs; the vLLM side points `engine.base_urls` at one `VLLMServer` serving the
same model directory (started here and not timed), so each step includes the weight sync the
trainer does after its update (safetensors to /dev/shm, then `reload_weights`). Cells are the
medians over steps of the trainer's own `time/generate`, `time/score`, `time/train`,
`time/sync`, and their sum.

Models: `tiny` (looprl's) or `smollm2` (SmolLM2-135M-Instruct, float32). Envs: `length` (one
turn, reward = reply length; any model's samples vary) or `calculator` (multi-turn, with the tool).

    .venv/bin/python benchmarks/engines_e2e.py --model smollm2 --env calculator   # ~10 min here
    .venv/bin/python benchmarks/engines_e2e.py --model tiny --steps 2             # a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
LENGTH_ENV = ROOT / "tests" / "envs" / "length_env.py"
KINDS = ("torch", "vllm")
PHASES = ("time/generate", "time/score", "time/train", "time/sync")


def train_config(kind: str, model: str, env: str, args: argparse.Namespace, out: Path, url: str):
    """The flat override dict for one side's run (no eval, one checkpoint at the end)."""
    env_name = str(LENGTH_ENV) if env == "length" else env
    return {
        "model.name": model, "env.name": env_name,
        "env.kwargs": {"max_tokens_per_turn": args.max_tokens},
        "rollout.tasks_per_step": args.tasks, "rollout.rollouts_per_task": args.rollouts,
        "trainer.steps": args.steps, "trainer.eval_every": 0, "trainer.eval_tasks": 2,
        "trainer.save_every": args.steps, "run.output_dir": str(out), "run.name": kind,
        "run.tensorboard": False, "engine.kind": kind,
        "engine.base_urls": [url] if kind == "vllm" else [],
    }  # fmt: skip


def e2e_times(
    out: Path, base_url: str, args: argparse.Namespace, model: str, env: str
) -> dict[str, dict[str, float]]:
    """Median seconds per phase (and their sum, `step`) of each side's GRPO steps."""
    from looprl.trainer.config import load_config
    from looprl.trainer.logger import METRICS_FILE, read_metrics
    from looprl.trainer.trainer import Trainer

    result = {}
    for kind in KINDS:
        cfg = train_config(kind, model, env, args, out, base_url)
        with contextlib.redirect_stdout(io.StringIO()):  # the trainer prints its config
            Trainer(load_config(None, cfg)).run()
        rows = read_metrics(out / kind / METRICS_FILE)
        times = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in PHASES}
        times["step"] = statistics.median(sum(r.get(k, 0.0) for k in PHASES) for r in rows)
        times["gen_tokens"] = statistics.median(r["rollout/gen_tokens"] for r in rows)
        result[kind] = times
    return result


def print_e2e(name: str, e2e: dict[str, dict[str, float]]) -> None:
    """One markdown table: a row per engine kind, a column per phase."""
    print(f"\n### End to end, {name}: median seconds per GRPO step\n")
    heads = (*PHASES, "step", "generated tokens")
    print("| engine | " + " | ".join(heads) + " |")
    print("|" + " --- |" * (len(heads) + 1))
    for kind, t in e2e.items():
        cells = [f"{t[k]:.3f}" for k in (*PHASES, "step")] + [f"{t['gen_tokens']:.0f}"]
        print(f"| {kind} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Start one vLLM server on the model, run both sides, print the table."""
    from looprl.engines.vllm_server import VLLMServer
    from looprl.models.loading import BUILTIN_MODELS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", choices=["tiny", "smollm2"])
    p.add_argument("--env", default="calculator", choices=["length", "calculator"])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--rollouts", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens per turn")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # the vLLM server needs the other core
    load = os.getloadavg()
    print(f"{os.cpu_count()} CPU cores, load average {load[0]:.2f} at start; {vars(args)}")
    model_dir = BUILTIN_MODELS[args.model]()
    with tempfile.TemporaryDirectory(prefix="looprl-e2e-") as tmp:
        t0 = time.perf_counter()
        with VLLMServer(model_dir, max_model_len=2048) as server:
            print(f"vLLM up in {time.perf_counter() - t0:.1f} s", flush=True)
            try:
                e2e = e2e_times(Path(tmp), server.base_url, args, args.model, args.env)
            except RuntimeError:
                print(f"the end of the vLLM server's log:\n{server.log_tail(60)}", file=sys.stderr)
                raise
    print_e2e(f"{args.model}, {args.env}", e2e)
    load = os.getloadavg()
    print(f"\nload average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return e2e


if __name__ == "__main__":
    main()
