"""Soak: mixed faults through `looprl train` and `looprl eval` for a while; no run may be lost.

Cycles until `--minutes` have passed, alternating:

- **train cycles**: `looprl train` on a warm-started tiny model in `benchmarks/soak_env.py`
  (a tool that hangs for good, a tool that answers with a lone surrogate and NaN, a reward
  function that raises), SIGKILLed at random moments, sometimes with its newest checkpoint
  damaged before `--resume`, resumed until it finishes;
- **eval cycles**: `looprl eval` against a fake OpenAI-compatible server that is stopped in the
  middle of the run (a dead server), then `--resume` against a fresh server until it finishes.

Each finished run is checked: exit code 0, every JSONL/JSON file strict JSON in valid UTF-8,
metric rows for every step exactly once, an exported `final/` model. A run that does not finish
within its attempts, or fails a check, is *lost*. Prints a table and writes `summary.json`.

    .venv/bin/python -m benchmarks.soak --minutes 30 --out runs/soak

With `--long`, one `looprl train` instead runs for `--minutes` on the same warm start, its tool
hanging, raising and answering malformed output at `--hang-rate`, `--raise-rate` and
`--malformed-rate` (resumed if it exits). Every `--sample` seconds the soak reads, from outside,
the steps done and the tool calls of the saved episodes (`benchmarks/soak_watch.py`), and the
trainer's resident memory, open file descriptors and threads from /proc. It prints a table per
`--window` minutes (and the whole run) and writes it, with every sample, to `summary.json`; exit
code 1 when a window trained no step or answered no tool call, or the trainer exited.

    .venv/bin/python -m benchmarks.soak --long --minutes 30 --window 5 --out runs/soak-long
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.soak_watch import RunCounters, Sample, format_table, read_proc, total_row, windows
from looprl.safe_json import loads_strict
from looprl.trainer.checkpoint.files import STEP_DIR
from looprl.trainer.logger import METRICS_FILE, read_metrics

ROOT = Path(__file__).resolve().parent.parent
SOAK_ENV = str(ROOT / "benchmarks" / "soak_env.py")
RECIPE = str(ROOT / "looprl" / "recipes" / "calculator_tiny.toml")
CHILD_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
MAX_RESTARTS = 20
"""--long: resume an exited trainer at most this often (a command that fails at once stops)."""


@dataclass
class Tally:
    """What the soak did and saw."""

    train_runs: int = 0
    eval_runs: int = 0
    runs_lost: int = 0
    lost: list[str] = field(default_factory=list)
    episodes: int = 0
    kills: int = 0
    checkpoints_damaged: int = 0
    server_deaths: int = 0
    resumes: int = 0
    hung_tool_calls: int = 0
    garbled_tool_results: int = 0
    reward_raises: int = 0
    infra_retried_episodes: int = 0


def warm_start(out: Path, seed: int) -> Path:
    """A tiny model that calls `calculate` on short prompts (cached in `out/sft`)."""
    sft_dir = out / "sft"
    if (sft_dir / "config.json").exists():
        return sft_dir
    from looprl.cli.demo import teacher_rows
    from looprl.envs.calculator import load_environment
    from looprl.models.loading import load_model
    from looprl.rendering.renderer import Renderer
    from looprl.sft.train import examples_from_rows, sft_train
    from looprl.trainer.checkpoint.single import export_hf
    from looprl.trainer.setup import seed_everything

    rows = teacher_rows(3000, seed, 1.0, load_environment().tool_schemas)
    short = [{"messages": r["messages"][1:], "tools": r["tools"]} for r in rows]  # no system
    seed_everything(seed)
    model, tokenizer = load_model("tiny")
    examples = examples_from_rows(lambda t: Renderer(tokenizer, t), short, tokenizer.eos_token)
    sft_train(model, examples, epochs=1.0, lr=1e-3, batch_size=32, seed=seed)
    export_hf(model, tokenizer, sft_dir)
    return sft_dir


def check_jsonl(path: Path) -> int:
    """Lines of a JSONL file, each strict JSON in strict UTF-8 (raises ValueError otherwise)."""
    text = path.read_bytes().decode("utf-8", errors="strict")
    lines = text.splitlines()
    for line in lines:
        loads_strict(line)
    return len(lines)


def damage_newest_checkpoint(run_dir: Path, rng: random.Random) -> bool:
    """Flip bytes in the largest file of the newest checkpoint when an older one is left to fall
    back to (with none, no resume is possible by design: the run would have to start over)."""
    ckpts = sorted(p for p in (run_dir / "checkpoints").glob("step_*") if STEP_DIR.match(p.name))
    if len(ckpts) < 2:
        return False
    files = sorted((p for p in ckpts[-1].iterdir() if p.is_file()), key=lambda p: p.stat().st_size)
    if not files:
        return False
    target = files[-1]
    data = bytearray(target.read_bytes())
    for _ in range(8):
        i = rng.randrange(len(data))
        data[i] ^= 0xFF
    target.write_bytes(bytes(data))
    return True


def train_command(sft: Path, out: Path, name: str, steps: int, seed: int) -> list[str]:
    """`looprl train` of the soak: 16 episodes a step (all saved), no evaluation before the end."""
    cmd = [sys.executable, "-m", "looprl.cli.main", "train", RECIPE, "--model.name", str(sft)]
    cmd += ["--env.name", SOAK_ENV, "--trainer.steps", str(steps)]
    cmd += ["--rollout.tasks_per_step", "4", "--rollout.rollouts_per_task", "4"]
    cmd += ["--trainer.eval_every", "0", "--trainer.eval_tasks", "8", "--trainer.seed", str(seed)]
    cmd += ["--trainer.save_rollouts", "16", "--run.tensorboard", "false"]
    return cmd + ["--run.output_dir", str(out), "--run.name", name]


def train_cycle(i: int, out: Path, sft: Path, rng: random.Random, t: Tally, steps: int) -> None:
    """One `looprl train` run, killed and damaged at random, resumed until it finishes."""
    name = f"train-{i:03d}"
    run_dir = out / name
    cmd = train_command(sft, out, name, steps, i) + ["--trainer.save_every", "2"]
    t.train_runs += 1
    for attempt in range(12):
        args = cmd + (["--resume", "--run-dir", str(run_dir)] if attempt else [])
        t.resumes += bool(attempt)
        log = (out / f"{name}.log").open("a")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=CHILD_ENV)
        kill_at = rng.uniform(3, 12) if rng.random() < 0.75 and attempt < 8 else None
        try:
            rc = proc.wait(timeout=kill_at if kill_at is not None else 900)
        except subprocess.TimeoutExpired:
            if kill_at is None:
                proc.kill()
                proc.wait()
                break
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            t.kills += 1
            if rng.random() < 0.5 and damage_newest_checkpoint(run_dir, rng):
                t.checkpoints_damaged += 1
            continue
        finally:
            log.close()
        if rc == 0:
            _verify_train(run_dir, steps, t, name)
            return
    t.runs_lost += 1
    t.lost.append(f"{name}: did not finish (see {name}.log)")


def _verify_train(run_dir: Path, steps: int, t: Tally, name: str) -> None:
    try:
        check_jsonl(run_dir / METRICS_FILE)
        rows = read_metrics(run_dir / METRICS_FILE)
        seen = [r["step"] for r in rows if r["step"] > 0]
        if seen != list(range(1, steps + 1)):
            raise ValueError(f"metric steps {seen}, expected 1..{steps} once each")
        if not (run_dir / "final" / "config.json").exists():
            raise ValueError("no exported final/ model")
        for path in sorted((run_dir / "rollouts").glob("*.jsonl")):
            check_jsonl(path)
            for line in path.read_text(encoding="utf-8").splitlines():
                ep = json.loads(line)
                tools = [m["content"] for m in ep["messages"] if m["role"] == "tool"]
                t.garbled_tool_results += sum("\ufffd NaN" in c for c in tools)
        t.episodes += sum(16 for _ in seen)
        t.hung_tool_calls += int(sum(r.get("rollout/infra_errors") or 0 for r in rows))
        t.reward_raises += int(sum(r.get("rollout/scoring_errors") or 0 for r in rows))
    except (OSError, ValueError, KeyError) as exc:
        t.runs_lost += 1
        t.lost.append(f"{name}: {exc}")


def _solver(req: dict[str, Any]) -> Any:
    from looprl.testing.fake_openai import FakeReply

    if any(m["role"] == "tool" for m in req["messages"]):
        return FakeReply(text=f"The answer is {req['messages'][-1]['content']}.")
    expr = req["messages"][-1]["content"].removeprefix("What is ").removesuffix("?")
    return FakeReply(tool_calls=[{"name": "calculate", "arguments": {"expression": expr}}])


def eval_cycle(i: int, out: Path, rng: random.Random, t: Tally) -> None:
    """One `looprl eval` against a server that dies mid-run, resumed against a fresh one."""
    from looprl.testing.fake_openai import FakeOpenAIServer

    name = f"eval-{i:03d}"
    run_dir = out / name
    t.eval_runs += 1
    for attempt in range(6):
        srv = FakeOpenAIServer(script=_solver, delay=0.05).start()
        cmd = [
            sys.executable,
            "-m",
            "looprl.cli.main",
            "eval",
            SOAK_ENV,
            "--base-url",
            srv.base_url,
        ]
        cmd += ["--model", "fake-model", "-n", "40", "-r", "2", "--concurrency", "4"]
        cmd += ["--output", str(run_dir)] + (["--resume"] if attempt else [])
        t.resumes += bool(attempt)
        with (out / f"{name}.log").open("a") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=CHILD_ENV)
            try:
                if attempt == 0 and _served(srv, proc, rng.randint(10, 120)):
                    srv.stop()  # the server dies under the running eval
                    t.server_deaths += 1
                rc = proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = -1
            finally:
                srv.stop()
        if rc == 0:
            _verify_eval(run_dir, t, name)
            return
    t.runs_lost += 1
    t.lost.append(f"{name}: did not finish (see {name}.log)")


def _served(srv: Any, proc: subprocess.Popen[bytes], n: int) -> bool:
    """Wait until `srv` has answered `n` requests (True) or `proc` has ended (False)."""
    while proc.poll() is None:
        if srv.request_count >= n:
            return True
        time.sleep(0.02)
    return False


def _verify_eval(run_dir: Path, t: Tally, name: str) -> None:
    try:
        n = check_jsonl(run_dir / "results.jsonl")
        if n != 80:
            raise ValueError(f"results.jsonl has {n} episodes, expected 80")
        meta = loads_strict((run_dir / "metadata.json").read_bytes().decode("utf-8"))
        if meta["status"] not in ("finished", "finished_with_errors"):
            raise ValueError(f"metadata status {meta['status']!r}")
        retried = run_dir / "retried.jsonl"
        t.infra_retried_episodes += check_jsonl(retried) if retried.exists() else 0
        t.episodes += n
        t.hung_tool_calls += int(meta["summary"].get("infra_errors", 0))
        t.reward_raises += int(meta["summary"].get("scoring_errors", 0))
    except (OSError, ValueError, KeyError) as exc:
        t.runs_lost += 1
        t.lost.append(f"{name}: {exc}")


def long_soak(out: Path, sft: Path, args: argparse.Namespace) -> int:
    """One `looprl train` for `args.minutes` (resumed if it exits), sampled from outside every
    `args.sample` seconds; prints and saves the table per `args.window` minutes."""
    run_dir, log_path = out / "long", out / "long.log"
    if run_dir.exists():
        print(f"{run_dir} exists from an earlier soak: remove it or pass another --out")
        return 2
    cmd = train_command(sft, out, run_dir.name, 10**6, args.seed) + ["--trainer.save_every", "10"]
    for flag in ("hang_rate", "raise_rate", "malformed_rate"):
        cmd += [f"--env.kwargs.{flag}", str(getattr(args, flag))]
    cmd += ["--env.kwargs.huge_every", "3"]  # a third of the malformed answers are huge
    cmd += ["--env.kwargs.tool_weight", str(args.tool_weight)]
    cmd += ["--env.kwargs.tool_isolation", args.tool_isolation, "--optim.lr", str(args.lr)]
    counters = RunCounters(run_dir)
    samples: list[Sample] = []
    exits: list[dict[str, Any]] = []
    t0 = time.monotonic()
    deadline = t0 + args.minutes * 60
    with log_path.open("a") as log:

        def start(argv: list[str]) -> subprocess.Popen[bytes]:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=CHILD_ENV)

        proc = start(cmd)
        while True:
            now = time.monotonic()
            if proc.poll() is not None and now < deadline and len(exits) < MAX_RESTARTS:
                exits.append(_exit_record(now - t0, proc.returncode, log_path))
                proc = start(cmd + ["--resume", "--run-dir", str(run_dir)])
            proc_now = read_proc(proc.pid)
            t = min(now, deadline) - t0  # the last sample closes the last window, not a new one
            samples.append(Sample(t, proc=proc_now, restarts=len(exits), **counters.read()))
            if now >= deadline:
                break
            time.sleep(min(args.sample, max(0.0, deadline - time.monotonic())))
        _stop(proc)
    return _report_long(out, args, samples, exits)


def _exit_record(seconds: float, code: int, log_path: Path) -> dict[str, Any]:
    """When the trainer exited, its exit code and the last line of its log."""
    lines = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    last = lines[-1] if lines else ""
    return {"minute": round(seconds / 60, 1), "exit_code": code, "last_line": last}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C the trainer, as a user would; kill it if it has not exited within a minute."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _report_long(
    out: Path, args: argparse.Namespace, samples: list[Sample], exits: list[dict[str, Any]]
) -> int:
    """Print the table per window and write `summary.json`; 1 when a window trained no step or
    got no tool call answered, or the trainer exited before the end."""
    rows = windows(samples, args.window * 60)
    total = total_row(samples)
    print(format_table([*rows, total]), flush=True)
    for e in exits:
        print(
            f"the trainer exited at minute {e['minute']} (code {e['exit_code']}): {e['last_line']}"
        )
    summary = {
        "mode": "long",
        "minutes": args.minutes,
        "window_minutes": args.window,
        "rates": {k: getattr(args, k) for k in ("hang_rate", "raise_rate", "malformed_rate")},
        "tool_weight": args.tool_weight,
        "windows": rows,
        "total": total,
        "exits": exits,
        "samples": [asdict(s) for s in samples],
        "loadavg_end": os.getloadavg(),
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.soak", *sys.argv[1:]]),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    stalled = [r["window"] for r in rows if not r["steps"] or not r["answered"]]
    if stalled or exits:
        print(
            f"not flat: windows {stalled} trained no step or answered no tool call; "
            f"{len(exits)} trainer exit(s); see {out / 'long.log'}"
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the soak and print what happened."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long the soak runs")
    p.add_argument("--out", default="runs/soak", help="working directory (runs, logs, summary)")
    p.add_argument("--steps", type=int, default=6, help="training steps per train cycle")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--long", action="store_true", help="one long `looprl train`, sampled")
    p.add_argument("--window", type=float, default=5.0, help="--long: minutes per table row")
    p.add_argument("--sample", type=float, default=10.0, help="--long: seconds between samples")
    p.add_argument("--hang-rate", type=float, default=0.05, help="--long: tool calls that hang")
    p.add_argument("--raise-rate", type=float, default=0.05, help="--long: tool calls that raise")
    p.add_argument("--malformed-rate", type=float, default=0.05, help="--long: malformed answers")
    p.add_argument(
        "--tool-isolation",
        choices=("thread", "process"),
        default="process",
        help="--long: where sync tool calls run (process: a hung call's child is killed; thread: "
        "hung threads pile up until the run stops and is resumed)",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=1e-5,
        help="--long: learning rate (the recipe's 1e-4 turns the tiny model to gibberish within "
        "a few hundred steps, and then it calls no tool)",
    )
    p.add_argument(
        "--tool-weight", type=float, default=0.5, help="--long: reward for using the tool"
    )
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:  # started in the background by a shell
        signal.signal(signal.SIGINT, signal.default_int_handler)  # children may be Ctrl-C'ed
    sft = warm_start(out, args.seed)
    print(f"warm start ready in {time.monotonic() - t0:.0f} s: {sft}", flush=True)
    if args.long:
        return long_soak(out, sft, args)
    tally = Tally()
    deadline = time.monotonic() + args.minutes * 60  # the warm start does not count
    i = 0
    while time.monotonic() < deadline:
        if i % 3 == 2:
            eval_cycle(i, out, rng, tally)
        else:
            train_cycle(i, out, sft, rng, tally, args.steps)
        i += 1
        print(f"[{(time.monotonic() - t0) / 60:5.1f} min] cycle {i}: {tally}", flush=True)
    summary = {
        **asdict(tally),
        "minutes": round((time.monotonic() - t0) / 60, 1),
        "loadavg_end": os.getloadavg(),
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.soak", *sys.argv[1:]]),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for key, value in summary.items():
        print(f"{key:24s} {value}")
    return 1 if tally.runs_lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
