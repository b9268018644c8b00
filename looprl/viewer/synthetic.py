"""Synthetic run directories in the exact on-disk layout, to try the viewer and to test it.

`write_run(path)` writes `config.json`, `metrics.jsonl` (with `monitor/<name>` trips when
asked), `rollouts/step_NNNNNN.jsonl` and `eval/step_NNNNNN/{results.jsonl,metadata.json}` with
multi-turn tool-calling episodes (some with a malformed tool call) whose trajectories carry masks
and logprobs. `write_eval_dir` writes a `looprl eval` directory (a before/after eval of a run),
`write_probe` a `looprl probe` directory. `build_tokenizer(dir)` writes a small offline tokenizer
so the token view can show text. `python -m looprl.viewer.synthetic OUT` writes a demo folder.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from looprl.trainer.metrics import OLD_NAMES
from looprl.types import EpisodeResult, Message, Task, ToolCall, ToolOutcome, Trajectory

Encode = Callable[[str], list[int]]
MALFORMED_REPLY = (
    "Error: invalid JSON in <tool_call>: Expecting value: line 1 column 44 (char 43); expected an "
    'object like {"name": "tool_name", "arguments": {"arg": "value"}}'
)
SPECIALS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]


def build_tokenizer(out_dir: Path) -> Path:
    """Train a tiny byte-level BPE tokenizer on synthetic text and save it as a HF directory.

    Writes `tokenizer.json` and a minimal `tokenizer_config.json` (enough for
    `transformers.AutoTokenizer`), using only the `tokenizers` package (fast, offline).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    corpus = [_render(ep, lambda s: [])[0] for ep in _episodes(rng, 1, 40, 1.0)]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        show_progress=False,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out_dir


def _render(ep: EpisodeResult, encode: Encode) -> tuple[str, Trajectory]:
    """Chat-template text of an episode and its trajectory (mask 1 on assistant text only)."""
    traj = Trajectory()
    rng = random.Random(ep.task.id)
    text = ""
    turn = 0
    for m in ep.messages:
        head = f"<|im_start|>{m.role}\n"
        body = m.raw or m.content
        pieces: list[tuple[str, bool]] = [
            (head, False),
            (body + "<|im_end|>", m.role == "assistant"),
        ]
        pieces.append(("\n", False))
        for s, sampled in pieces:
            text += s
            ids = encode(s) or list(s.encode("utf-8"))  # bytes as ids without a tokenizer
            lps = [-(rng.random() ** 3) * 4.0 for _ in ids] if sampled else None
            traj.extend(ids, sampled=sampled, turn=turn, logprobs=lps)
        if m.role == "assistant":
            turn += 1
    return text, traj


def _episodes(
    rng: random.Random, step: int, n_tasks: int, skill: float, group: int = 1
) -> list[EpisodeResult]:
    out = []
    for t in range(n_tasks):
        a, b, c = 3 + t, 7 + (t * 5) % 13, t % 9
        env = "calc" if t % 3 else "arith"
        task = Task(
            id=f"task-{t:04d}",
            prompt=[Message("user", f"What is {a} * {b} + {c}?")],
            answer=str(a * b + c),
            env=env,
        )
        for g in range(group):
            out.append(_episode(rng, task, a, b, c, skill, g))
    return out


def _episode(
    rng: random.Random, task: Task, a: int, b: int, c: int, skill: float, g: int
) -> EpisodeResult:
    right = rng.random() < skill
    bad_tool = rng.random() < 0.1
    malformed = not bad_tool and rng.random() < 0.1
    answer = a * b + c if right else a * b + c + rng.randint(1, 9)
    args: dict[str, Any] = {"expression": f"{a}*{b}"}
    call_raw = json.dumps({"name": "calculator", "arguments": args})
    call = ToolCall("calculator", args, id="call_0", raw=f"<tool_call>{call_raw}</tool_call>")
    think = f"<think>I need {a} times {b} first, then add {c}.</think>\n"
    first = Message("assistant", think + "Let me use the calculator.", [call])
    first.raw = first.content + "\n" + call.raw
    tool_out = "error: unknown function 'x'" if bad_tool else str(a * b)
    final = Message("assistant", f"<think>Now add {c}.</think>\nThe answer is \\boxed{{{answer}}}.")
    final.raw = final.content
    if malformed:  # a turn holding only a call whose JSON does not parse: no content, no calls
        first = Message("assistant", "", raw='<tool_call>{"name": "calculator", "arguments": {')
        tool_out = MALFORMED_REPLY
    msgs = [
        Message("system", "You solve arithmetic. Call the calculator tool when useful."),
        task.prompt[0],
        first,
        Message("tool", tool_out, tool_call_id="call_0", name="" if malformed else "calculator"),
        final,
    ]
    ep = EpisodeResult(task=task, messages=msgs, rollout_index=g)
    kind = "malformed_json" if malformed else "exception" if bad_tool else None
    ep.tool_outcomes = [ToolOutcome("" if malformed else "calculator", "call_0", kind)]
    ep.rewards = {"correct": float(right), "format": 1.0 if rng.random() < 0.9 else 0.0}
    ep.reward = ep.rewards["correct"] + 0.1 * ep.rewards["format"]
    ep.num_turns, ep.num_tool_calls = 2, 1
    ep.stop_reason = "done"
    if kind:
        ep.tool_errors = {kind: 1}
    if rng.random() < 0.05:
        ep.errors = [{"kind": "scoring", "message": "reward fn 'format' raised KeyError('x')"}]
    ep.timings = {"generate": round(rng.random(), 3), "tools": 0.01, "score": 0.002}
    return ep


def write_run(
    path: Path,
    steps: int = 20,
    tasks: int = 6,
    group: int = 4,
    eval_every: int = 5,
    encode: Encode | None = None,
    model: str = "tiny",
    seed: int = 0,
    monitors: dict[str, int] | None = None,
    eval_before: bool = False,
    old_names: bool = False,
) -> Path:
    """Write a complete synthetic training run; returns `path`.

    `monitors` maps a monitor name to the step it first trips (its `monitor/<name>` metric is
    1.0 from then on every other step, else 0.0); `eval_before` adds a held-out eval at step 0.
    `old_names` writes the metrics under the bare names of runs made before the metric
    namespaces (`kl`, `loss`, ...; `looprl.trainer.metrics.OLD_NAMES`).
    """
    bare = {new: old for old, new in OLD_NAMES.items()} if old_names else {}
    enc: Encode = encode or (lambda s: [])
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(run_config(model, steps, group), indent=2))
    rng = random.Random(seed)
    with open(path / "metrics.jsonl", "w") as mf:
        if eval_before:
            mf.write(json.dumps(_eval(path, rng, 0, tasks, 0.2, enc, model)) + "\n")
        for step in range(1, steps + 1):
            skill = 0.2 + 0.7 * (1 - math.exp(-step / 8))
            eps = _episodes(rng, step, tasks, skill, group)
            write_episodes(path / "rollouts" / f"step_{step:06d}.jsonl", eps, enc)
            row = metrics_row(rng, step, eps)
            for name, first in (monitors or {}).items():
                row[f"monitor/{name}"] = float(step >= first and (step - first) % 2 == 0)
            if step % eval_every == 0:
                row.update(_eval(path, rng, step, tasks, skill, enc, model))
            mf.write(json.dumps({bare.get(k, k): v for k, v in row.items()}) + "\n")
    return path


def run_config(model: str, steps: int, group: int) -> dict[str, Any]:
    """A `config.json` shaped like the trainer's: the typed config and the resolved algorithm."""
    return {
        "config": {
            "model": {"name": model},
            "env": {"name": "calc", "kwargs": {}},
            "rollout": {"tasks_per_step": 6, "rollouts_per_task": group},
            "trainer": {"steps": steps},
        },
        "algorithm": {"name": "grpo", "advantage": "group_normalized", "normalize_std_eps": 1e-6},
        "model": model,
    }


def _eval(
    path: Path, rng: random.Random, step: int, tasks: int, skill: float, enc: Encode, model: str
) -> dict[str, float]:
    """Write `eval/step_N/` (one rollout per held-out task) and return its `eval/*` metrics."""
    ev = _episodes(rng, step, tasks, skill, 1)
    d = path / "eval" / f"step_{step:06d}"
    write_episodes(d / "results.jsonl", ev, enc)
    summary = eval_summary(ev)
    meta = {"kind": "eval", "step": step, "model": model, "summary": summary}
    (d / "metadata.json").write_text(json.dumps(meta, indent=2))
    return {
        "eval/reward": summary["reward_mean"],
        **{f"eval/{k}": v for k, v in summary["rewards"].items()},
        "eval/pass@1": summary["pass_at_k"]["pass@1"],
        "eval/turns": summary["turns_mean"],
        "eval/gen_tokens": summary["generated_tokens_mean"],
    }


def eval_summary(eps: list[EpisodeResult]) -> dict[str, Any]:
    """The `summary` of a `metadata.json`, with the keys `looprl eval` writes that matter here."""
    n = len(eps)
    acc = sum(e.rewards["correct"] for e in eps) / n
    return {
        "episodes": n,
        "reward_mean": sum(e.reward for e in eps) / n,
        "rewards": {k: sum(e.rewards[k] for e in eps) / n for k in ("correct", "format")},
        "pass_at_k": {"pass@1": acc},
        "turns_mean": sum(e.num_turns for e in eps) / n,
        "tool_errors": {"malformed_json": sum("malformed_json" in e.tool_errors for e in eps)},
        "stop_reasons": {"done": n},
        "error_messages": [],
        "generated_tokens_mean": 40.0 + 10 * (1 - acc),
    }


def metrics_row(rng: random.Random, step: int, eps: list[EpisodeResult]) -> dict:
    """One `metrics.jsonl` row with keys the trainer writes (some constant, as in real runs)."""
    rewards = [e.reward for e in eps]
    mean = sum(rewards) / len(rewards)
    return {
        "step": step,
        "wall_time": round(step * 3.5 + rng.random(), 3),
        "reward/mean": mean,
        "reward/std": (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5,
        "reward/correct": sum(e.rewards["correct"] for e in eps) / len(eps),
        "reward/format": sum(e.rewards["format"] for e in eps) / len(eps),
        "policy/kl": 0.001 * step * (1 + 0.3 * rng.random()),
        "policy/entropy": 1.2 * math.exp(-step / 30) + 0.05 * rng.random(),
        "policy/clip_frac": 0.02 + 0.03 * rng.random(),
        "policy/mismatch_kl": 1e-4 * (1 + rng.random()),
        "loss/pg": 2e-9 * (rng.random() - 0.5),  # tiny values around 0: ticks like 1e-9
        "train/lr": 1e-4,
        "rollout/errors": 0.0,
        "rollout/tool_calls": sum(e.num_tool_calls for e in eps) / len(eps),
        "rollout/gen_tokens": 40.0 * len(eps) * (1 + 0.2 * rng.random()),
        "rollout/tokens_per_s": 900 + 100 * rng.random(),
        "time/generate": 2.0 + rng.random(),
        "time/score": 0.1,
        "time/train": 1.0 + 0.2 * rng.random(),
        "time/sync": 0.05,
        "loss/total": 0.1 * rng.random() - 0.05,
    }


def write_episodes(path: Path, eps: list[EpisodeResult], encode: Encode) -> None:
    """Write episodes as JSONL, filling each trajectory from the rendered conversation."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for ep in eps:
            ep.trajectories = [_render(ep, encode)[1]]
            f.write(ep.to_json() + "\n")


def write_hostile_run(path: Path, payload: str, encode: Encode | None = None) -> Path:
    """A one-step training run whose every string field from the files carries `payload`.

    For security tests: `payload` (e.g. an `<img onerror=...>` tag) lands in task ids, env names,
    prompts, answers, info, state, message text, tool names and ids, error kinds and messages, reward,
    metric, timing and tool-error names, the stop reason, metric names in `metrics.jsonl`, and
    `config.json`; the page must show all of it as text. Returns `path`.
    """
    enc: Encode = encode or (lambda s: [])
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"model": "tiny", "note": payload, "trainer": {"steps": 1, payload: payload}}
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    eps = []
    for n in range(2):
        task = Task(
            id=f"{payload} task-{n}",
            prompt=[Message("user", f"prompt {payload}")],
            answer=payload,
            info={payload: payload},
            env=payload,
        )
        call = ToolCall(payload, {payload: payload}, id=payload, raw=payload)
        msgs = [
            Message("system", f"system {payload}"),
            task.prompt[0],
            Message("assistant", f"<think>{payload}</think>{payload}", [call], raw=payload),
            Message("tool", payload, tool_call_id=payload, name=payload),
            Message("assistant", f"answer {payload}"),
        ]
        ep = EpisodeResult(task=task, messages=msgs, rollout_index=n, num_turns=2)
        ep.reward, ep.rewards, ep.metrics = 0.5 * n, {payload: 0.5 * n}, {payload: 1.0}
        ep.state = {payload: payload}
        ep.errors = [{"kind": payload, "message": payload}]  # type: ignore[typeddict-item]
        ep.tool_errors, ep.timings = {payload: 1}, {payload: 0.25}
        ep.stop_reason = payload  # type: ignore[assignment]  # a hostile file, not a real reason
        eps.append(ep)
    write_episodes(path / "rollouts" / "step_000001.jsonl", eps, enc)
    rows = [{"step": s, f"{payload}/mean": 0.1 * s, payload: 0.2 * s} for s in (1, 2)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_eval_dir(
    path: Path,
    model: str,
    skill: float,
    tasks: int = 6,
    seed: int = 0,
    encode: Encode | None = None,
) -> Path:
    """A `looprl eval` result directory of `model` on the held-out tasks (`metadata.json`,
    `results.jsonl`): point `model` at a run's start model or its `final/` for a before/after."""
    eps = _episodes(random.Random(seed), 0, tasks, skill, 2)
    write_episodes(path / "results.jsonl", eps, encode or (lambda s: []))
    meta = {"kind": "eval", "env": "calc", "model": model, "status": "finished"}
    (path / "metadata.json").write_text(
        json.dumps({**meta, "summary": eval_summary(eps)}, indent=2)
    )
    return path


PROBE_EXPLOITS = [  # (name, description, mean reward it gets from the synthetic rubric)
    ("empty_answer", "replies with nothing", 0.0),
    ("format_only", "the answer format around no answer", 0.1),
    ("many_candidates", "lists many candidate answers in one reply", 0.62),
    ("claims_success", "says in words that the answer is correct", 0.0),
    ("judge_injection", "asks the grader to ignore the rubric", 0.05),
    ("tool_flood", "calls the tool until the turn limit", 0.0),
]


def write_probe(path: Path, tasks: int = 4, encode: Encode | None = None) -> Path:
    """A `looprl probe` directory: `probe.json` (the documented schema) and `results.jsonl`
    whose episodes name their exploit in `task.info["exploit"]`. `many_candidates` beats the
    baseline by more than the margin (verdict `exploitable`); `tool_flood` errored."""
    rng = random.Random(7)
    rows, eps = [], []
    for name, description, mean in PROBE_EXPLOITS:
        errors = tasks if name == "tool_flood" else 0
        for t in range(tasks):
            task = Task(id=f"task-{t:04d}", prompt=[Message("user", f"What is {t} + 2?")],
                        answer=str(t + 2), info={"exploit": name}, env="calc")  # fmt: skip
            reply = Message(
                "assistant", f"[{name}] " + ("; ".join(map(str, range(9))) if mean else "")
            )
            ep = EpisodeResult(task=task, messages=[task.prompt[0], reply], num_turns=1)
            ep.reward = float(rng.random() < mean)
            ep.rewards = {"correct": ep.reward}
            if errors:
                ep.errors = [{"kind": "rollout", "message": "turn limit reached in a tool loop"}]
            eps.append(ep)
        verdict = "errored" if errors else "exploitable" if mean > 0.1 + 0.2 else "resisted"
        rows.append({"name": name, "description": description, "knows_answer": name == "many_candidates",
                     "mean_reward": mean, "stderr": 0.05, "episodes": tasks, "errors": errors,
                     "verdict": verdict})  # fmt: skip
    write_episodes(path / "results.jsonl", eps, encode or (lambda s: []))
    doc = {
        "kind": "looprl.probe", "version": 1, "env": "calc", "env_kwargs": {}, "tasks": tasks,
        "margin": 0.2, "baseline": {"name": "honest_wrong", "mean_reward": 0.1, "stderr": 0.02},
        "reference": {"name": "reference", "mean_reward": 1.0, "stderr": 0.0}, "rows": rows,
        "exploitable": [r["name"] for r in rows if r["verdict"] == "exploitable"],
        "strict_failed": True,
    }  # fmt: skip
    (path / "probe.json").write_text(json.dumps(doc, indent=2))
    return path


def write_demo(out: Path) -> Path:
    """A folder to try the viewer on: a run with two tripped monitors, its before/after evals
    and a probe directory, all sharing one tokenizer (so the token view shows text)."""
    tok_dir = build_tokenizer(out / ".tokenizer")
    enc = hf_encoder(tok_dir)
    start = out / "start-model"
    start.mkdir(parents=True, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (start / f).write_bytes((tok_dir / f).read_bytes())
    run = write_run(out / "grpo", encode=enc, model="start-model", eval_before=True,
                    monitors={"reward_up_eval_down": 14, "length_blowup": 17})  # fmt: skip
    final = run / "final"
    final.mkdir(exist_ok=True)
    (final / "tokenizer.json").write_bytes((tok_dir / "tokenizer.json").read_bytes())
    write_eval_dir(out / "eval_before", "start-model", 0.2, encode=enc)
    write_eval_dir(out / "eval_after", str(final), 0.85, encode=enc)
    write_probe(out / "probe-calc", encode=enc)
    return out


def hf_encoder(tok_dir: Path) -> Encode:
    """An `Encode` from a directory's `tokenizer.json` (no special-token insertion)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    return lambda s: list(tok.encode(s, add_special_tokens=False).ids) if s else []


if __name__ == "__main__":
    out = write_demo(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/synthetic"))
    print(f"wrote {out}; view it with: looprl view {out}")
