"""looprl against TRL's GRPOTrainer, side by side in one run on CPU: speed, memory, reward, time-to-target.

Both frameworks start from the same warm-started tiny model (`--init`, the demo's SFT output: an
untrained model scores 0 everywhere, and a batch without reward variance trains nothing), see
the same training prompts in the same order, and are scored by the same held-out evaluator.
TRL runs in its own venv (benchmarks/.venvs/trl, made by `peer_venv.ensure_venv` with the pins
in TRL_REQUIREMENTS) through `benchmarks/trl_worker.py`; each run is a fresh process, so peak
memory is per run. Runs alternate looprl, TRL, looprl, TRL, ... so machine load hits both alike;
ratios are taken pair by pair (repeat r of one against repeat r of the other).

Tasks:
  single: the calculator's first turn, scored without running the tool: 1 when the turn calls
          `calculate` on an expression whose value is the answer, or states the answer.
  multi:  the calculator itself (tool calls over up to --max-turns turns); reward 1 when the
          final reply's number equals the answer. TRL runs it with `GRPOTrainer(tools=...)`.
Both rewards live in trl_worker.py (stdlib only); looprl's side uses looprl's own parser,
`calculate` and `extract_answer`, and `check_rewards()` asserts the two agree on probe replies
before anything is timed. The prompt token ids of the first task are compared too.

Matched: model and tokenizer, tasks and order, prompts x generations, max completion tokens,
temperature 1 (top-p 1, top-k off), GRPO advantages (group mean and unbiased std, +1e-4: looprl's
eps is set to TRL's), clipped token ratio eps 0.2, per-sequence mean aggregation over the whole
batch (looprl `grpo` = TRL `loss_type="grpo"`), beta 0 (no reference model), one optimizer
update per batch, AdamW (lr, betas, eps 1e-8, no weight decay), constant lr without warm-up
(HF's warm-up starts at lr 0, looprl's at lr/warmup, so warm-up is off), grad clip 1.0, float32,
--threads torch threads.

Remaining differences (kept, each is how the framework works out of the box):
  1. Generation: looprl's TorchEngine (KV cache, continuous batching) vs TRL's default
     `model.generate` on a left-padded batch (multi-turn: one batch per tool round).
  2. Zero-advantage samples: looprl skips their forward and backward (exactly zero gradient);
     TRL computes them. Both count them in the loss normaliser. train tok/s counts every
     completion token of the batch on both sides.
  3. Token budget: looprl caps each turn at --max-tokens (episodes up to --max-turns turns);
     TRL caps the whole completion, tool results included, at --max-tokens.
  4. Multi-turn parsing: TRL parses tool calls with its Qwen3 response template (the hermes
     format looprl's template writes); a malformed call ends TRL's episode, while looprl answers
     it with an error message. Tool results and error texts differ slightly.
  5. Step time: looprl's is generate + train + weight sync from its metrics; TRL's is
     `on_step_begin` to `on_step_end` (generation, scoring, loss, optimizer step).
  6. Data order within a step and sampling seeds differ (same prompts per step, other samples).

Held-out accuracy: checkpoints every --eval-every steps (looprl's own checkpoints; TRL's via a
callback) are scored afterwards by one process with `trl_worker.heldout_accuracy` (greedy, the
same code for both). Time-to-target is the summed step time up to the first checkpoint whose
accuracy reaches --target (evaluation and saving excluded).

    .venv/bin/python benchmarks/vs_trl.py            # 8 steps x 4x4, 3 runs each, both tasks (~25 min, 2 busy cores)
    .venv/bin/python benchmarks/vs_trl.py --quick    # 2 steps x 2x2, 1 run each: plumbing only (~4 min)

`--looprl-ref REF` runs looprl's side on a git ref's code (exported with `git archive`, run as
that code's own `benchmarks/vs_trl.py _looprl`) against the same TRL runs: how the ratios moved
since REF, on the same machine in the same hour.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: make `benchmarks` importable

from benchmarks import trl_worker  # noqa: E402  (stdlib-only module)
from benchmarks.peer_venv import ensure_venv, installed_versions  # noqa: E402
from benchmarks.vs_trl_report import SIDES, print_task  # noqa: E402

TRL_REQUIREMENTS = ["trl==1.16.0", "transformers==5.24.0"]  # transformers as looprl's, same forward
WORKER = Path(__file__).with_name("trl_worker.py")
PROBES = [  # (reply, answer) pairs on which both sides' rewards must agree
    ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 * 3 + 1"}}\n</tool_call>', "7"),
    ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 * 3"}}\n</tool_call>', "7"),
    ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 *"}}\n</tool_call>', "7"),
    ('<tool_call>\n{"name": "calculate", "arguments": ', "7"),
    ("The answer is 7.", "7"), ("The answer is 1,234.", "1234"), ("It is 5, or 7", "7"),
    ("The answer is -12.", "-12"), ("The answer is 8.", "7"), ("no number", "7"),
]  # fmt: skip


# ------------------------------------------------------------------ the looprl side
def load_environment(max_tokens_per_turn: int = 96, **kwargs: Any) -> Any:
    """The single-turn task as a looprl environment: calculator prompts and tools, one turn, no tool run."""
    from looprl.envs.base import Limits, SingleTurnEnv
    from looprl.envs.calculator import SYSTEM_PROMPT, generate_tasks
    from looprl.envs.calculator import load_environment as calculator
    from looprl.rubrics import Rubric

    schemas = calculator().tool_schemas

    class FirstTurnEnv(SingleTurnEnv):
        @property
        def tool_schemas(self) -> list[dict[str, Any]]:
            return schemas

    return FirstTurnEnv(
        name="calculator_first_turn",
        rubric=Rubric([looprl_first_turn_reward]),
        train_tasks=lambda n, seed: generate_tasks("train", n, seed),
        eval_tasks=lambda n, seed: generate_tasks("eval", n, seed),
        limits=Limits(max_turns=1, max_tokens_per_turn=max_tokens_per_turn),
        system_prompt=SYSTEM_PROMPT,
    )


def first_turn_text_reward(text: str, answer: str) -> float:
    """The single-turn reward written with looprl's parser, `calculate` and `extract_answer`."""
    from looprl.envs.calculator import calculate, extract_answer
    from looprl.rendering.parser import HermesParser

    parsed = HermesParser().parse(text)
    for call in parsed.calls:
        if call.name == "calculate":
            try:
                if calculate(str(call.arguments.get("expression", ""))) == answer:
                    return 1.0
            except (ValueError, ZeroDivisionError, OverflowError):
                pass
    return float(extract_answer(parsed.content) == answer)


def looprl_first_turn_reward(episode: Any) -> float:
    """Rubric function of the single-turn task (raw text of the one assistant turn)."""
    raw = next(m.raw for m in episode.messages if m.role == "assistant")
    return first_turn_text_reward(raw or "", episode.task.answer or "")


def check_rewards() -> None:
    """Raise when looprl's and the worker's rewards disagree on any probe reply."""
    from looprl.envs.calculator import extract_answer
    from looprl.rendering.parser import HermesParser

    for text, answer in PROBES:
        ours = first_turn_text_reward(text, answer)
        theirs = trl_worker.first_turn_reward(text, answer)
        content = HermesParser().parse(text).content
        final_ours = float(extract_answer(content) == answer)
        final_theirs = trl_worker.answer_reward(trl_worker.strip_calls(text), answer)
        if ours != theirs or final_ours != final_theirs:
            raise SystemExit(
                f"reward mismatch on {text!r}: looprl {ours}/{final_ours}, worker {theirs}/{final_theirs}"
            )


def env_settings(spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(env.name, env.kwargs) of looprl's side for the spec's task."""
    if spec["task"] == "single":
        return str(Path(__file__).resolve()), {"max_tokens_per_turn": spec["max_tokens"]}
    return "calculator", {"max_turns": spec["max_turns"], "max_tokens_per_turn": spec["max_tokens"]}


def looprl_train(spec: dict[str, Any]) -> dict[str, Any]:
    """Run GRPO with looprl's Trainer (in this process); the same record as the worker's `train`."""
    import resource

    import torch

    from looprl.trainer.config import load_config
    from looprl.trainer.logger import METRICS_FILE, read_metrics
    from looprl.trainer.trainer import Trainer

    torch.set_num_threads(spec["threads"])
    env_name, env_kwargs = env_settings(spec)
    cfg = load_config(
        None,
        {
            "model.name": spec["model"], "env.name": env_name, "env.kwargs": env_kwargs,
            "algorithm.preset": "grpo", "algorithm.overrides": {"normalize_std_eps": 1e-4},
            "rollout.tasks_per_step": spec["prompts_per_step"], "rollout.rollouts_per_task": spec["generations"],
            "rollout.temperature": spec["temperature"], "rollout.max_tokens": spec["max_tokens"],
            "optim.lr": spec["lr"], "optim.beta1": spec["beta1"], "optim.beta2": spec["beta2"],
            "optim.warmup_steps": 0, "optim.schedule": "constant", "optim.grad_clip": spec["grad_clip"],
            "trainer.steps": spec["steps"], "trainer.seed": spec["seed"], "trainer.eval_every": 0,
            "trainer.eval_tasks": 1, "trainer.save_every": spec["save_every"] or spec["steps"],
            "trainer.keep_last": spec["steps"], "trainer.save_rollouts": 0, "trainer.device": "cpu",
            "run.output_dir": spec["save_dir"], "run.name": "run", "run.tensorboard": False,
        },
    )  # fmt: skip
    trainer = Trainer(cfg)
    trainer.run()
    rows = read_metrics(trainer.run_dir / METRICS_FILE)
    steps = [
        {
            "step": r["step"], "step_s": r["time/generate"] + r["time/train"] + r["time/sync"],
            "generate_s": r["time/generate"], "train_s": r["time/train"], "gen_tokens": r["rollout/gen_tokens"],
            "train_tokens": r["train/tokens"], "forward_tokens": r["train/forward_tokens"], "reward": r["reward/mean"],
        }
        for r in rows
    ]  # fmt: skip
    first = next(trainer.env.iter_train_tasks(spec["seed"], start=0))
    prompt_ids = trainer.renderer.prompt_ids(first.prompt)
    return {
        "steps": steps,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "prompt_ids": prompt_ids,
        "checkpoints": {
            str(k): str(trainer.run_dir / "checkpoints" / f"step_{k:06d}" / "model.safetensors")
            for k in range(spec["save_every"], spec["steps"] + 1, spec["save_every"] or 1)
        },
    }


# ------------------------------------------------------------------ specs and subprocesses
def task_rows(task: str, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """(train rows in looprl's draw order for every step, held-out rows) as template messages."""
    from looprl.envs.calculator import load_environment as calculator

    env = load_environment() if task == "single" else calculator()
    stream = env.iter_train_tasks(args.seed, start=0)
    train = [next(stream) for _ in range(args.prompts * args.steps)]
    held = env.get_tasks("eval", args.eval_tasks, seed=args.seed)

    def rows(tasks: list[Any]) -> list[dict]:
        return [
            {"messages": [m.to_template() for m in t.prompt], "answer": t.answer} for t in tasks
        ]

    return rows(train), rows(held)


def make_spec(task: str, args: argparse.Namespace, save_dir: Path) -> dict[str, Any]:
    """The settings both sides read."""
    train, held = task_rows(task, args)
    return {
        "task": task, "model": str(args.init.resolve()), "train": train, "eval": held,
        "steps": args.steps, "prompts_per_step": args.prompts, "generations": args.generations,
        "max_tokens": args.max_tokens, "max_turns": args.max_turns, "lr": args.lr, "beta1": 0.9,
        "beta2": 0.99, "grad_clip": 1.0, "temperature": 1.0, "seed": args.seed,
        "threads": args.threads, "save_every": args.eval_every, "save_dir": str(save_dir),
    }  # fmt: skip


def run_json(
    cmd: list[str], spec: dict[str, Any], tmp: Path, what: str, code: Path = ROOT
) -> dict[str, Any]:
    """Run `cmd SPEC OUT` in a fresh process on the looprl in `code` and return OUT's JSON.

    Exits with the process's output when it fails.
    """
    spec_path, out_path = tmp / f"{what}.spec.json", tmp / f"{what}.out.json"
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run(
        [*cmd, str(spec_path), str(out_path)], cwd=code, capture_output=True, text=True,
        env={**_env(), "PYTHONPATH": str(code)},
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(
            f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
        )
    return json.loads(out_path.read_text())


def _env() -> dict[str, str]:
    import os

    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_side(
    side: str, spec: dict[str, Any], trl_python: Path, tmp: Path, tag: str, code: Path = ROOT
) -> dict[str, Any]:
    """One training run of one framework in a fresh process (looprl's from the tree at `code`)."""
    save = tmp / tag
    save.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "save_dir": str(save)}
    t0 = time.perf_counter()
    if side == "looprl":
        script = str(code / "benchmarks" / "vs_trl.py")
        out = run_json([sys.executable, script, "_looprl"], spec, tmp, tag, code)
    else:
        out = run_json([str(trl_python), str(WORKER), "train"], spec, tmp, tag)
        every = spec["save_every"]
        out["checkpoints"] = {
            str(k): str(save / f"step_{k:06d}.safetensors")
            for k in range(every, spec["steps"] + 1, every or 1)
        }
    out["wall_s"] = time.perf_counter() - t0
    return out


def evaluate_all(
    spec: dict[str, Any], runs: dict[str, list[dict]], python: Path, tmp: Path
) -> None:
    """Held-out accuracy of every checkpoint of every run (and of the start), in one process."""
    ckpts: dict[str, str | None] = {"init": None}
    for side, side_runs in runs.items():
        for r, run in enumerate(side_runs):
            for step, path in run["checkpoints"].items():
                ckpts[f"{side}/{r}/{step}"] = path
    acc = run_json(
        [str(python), str(WORKER), "eval"],
        {**spec, "checkpoints": ckpts},
        tmp,
        f"eval-{spec['task']}",
    )
    for side, side_runs in runs.items():
        for r, run in enumerate(side_runs):
            run["accuracy"] = {0: acc["accuracy"]["init"]} | {
                int(s): acc["accuracy"][f"{side}/{r}/{s}"] for s in run["checkpoints"]
            }


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (`--quick` shrinks everything to a smoke-sized budget)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--init", type=Path, default=Path("runs/demo/sft"), help="warm-started model directory"
    )
    p.add_argument("--tasks", nargs="+", default=["single", "multi"], choices=["single", "multi"])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--generations", type=int, default=4, help="completions per prompt (G)")
    p.add_argument(
        "--max-tokens", type=int, default=64, help="max completion tokens (per turn for looprl)"
    )
    p.add_argument(
        "--max-turns", type=int, default=4, help="assistant turns of the multi-turn task"
    )
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--repeats", type=int, default=3, help="runs per framework (alternating)")
    p.add_argument("--eval-every", type=int, default=4, help="checkpoint and score every N steps")
    p.add_argument("--eval-tasks", type=int, default=16)
    p.add_argument("--target", type=float, default=0.5, help="held-out accuracy for time-to-target")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="2 steps of 2x2, 1 run each (smoke test)")
    p.add_argument(
        "--looprl-ref", default=None, metavar="REF",
        help="run looprl's side on this git ref's code (git archive) instead of the working tree",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.eval_every < 1 or args.repeats < 1:
        p.error("--eval-every and --repeats must be >= 1")
    if args.quick:
        args.steps, args.prompts, args.generations, args.repeats = 2, 2, 2, 1
        args.max_tokens, args.eval_every, args.eval_tasks = 32, 2, 2
    return args


def main() -> None:
    """Set up TRL's venv, run both frameworks alternately on each task, print the comparison."""
    if len(sys.argv) == 4 and sys.argv[1] == "_looprl":  # the looprl side, in its own process
        spec = json.loads(Path(sys.argv[2]).read_text())
        Path(sys.argv[3]).write_text(json.dumps(looprl_train(spec)))
        return
    args = parse_args()
    if not (args.init / "config.json").exists():
        raise SystemExit(
            f"{args.init} is not a model directory; run `make demo` first or pass --init DIR"
        )
    t0 = time.perf_counter()
    python = ensure_venv("trl", TRL_REQUIREMENTS)
    check_rewards()
    setup_figures(args)
    versions = installed_versions(
        python, ["trl", "transformers", "accelerate", "datasets", "torch"]
    )
    print(f"TRL venv: {versions}; roof {args.roof:.0f} GFLOP/s fp32, {args.threads} threads")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        code = ROOT
        if args.looprl_ref:
            from benchmarks.compare_ref import export_ref

            code = export_ref(args.looprl_ref, tmp)
            print(f"looprl side: the code of {args.looprl_ref} (git archive), not the working tree")
        for task in args.tasks:
            spec = make_spec(task, args, tmp)
            runs: dict[str, list[dict]] = {side: [] for side in SIDES}
            for r in range(args.repeats):
                order = SIDES if r % 2 == 0 else SIDES[::-1]
                for side in order:
                    tag = f"{task}-{side}-{r}"
                    runs[side].append(run_side(side, spec, python, tmp, tag, code))
            same = runs["looprl"][0]["prompt_ids"] == runs["trl"][0]["prompt_ids"]
            trl0 = runs["trl"][0]
            print(
                f"{task}: first prompt token ids identical on both sides: {same}; TRL ran with "
                f"{trl0['versions']['torch_threads']} torch threads, replaced the chat template: "
                f"{trl0['replaced_template']}"
            )
            evaluate_all(spec, runs, python, tmp)
            print_task(task, spec, runs, args)
    print(f"total wall time {time.perf_counter() - t0:.0f} s")


def setup_figures(args: argparse.Namespace) -> None:
    """Measure the fp32 matmul roof and the model's forward FLOPs per token (set on `args`)."""
    import torch

    from benchmarks.roofline import matmul_gflops, model_flops_per_token
    from looprl.models.loading import load_model

    torch.set_num_threads(args.threads)
    args.roof = matmul_gflops()[0]
    model, _ = load_model(str(args.init), device="cpu")
    args.flops_per_token = model_flops_per_token(model)


if __name__ == "__main__":
    main()
