"""Synthetic run directories in the exact on-disk layout, to try the viewer and to test it.

`write_run(path)` writes `config.json`, `metrics.jsonl`, `rollouts/step_NNNNNN.jsonl` and
`eval/step_NNNNNN/{results.jsonl,metadata.json}` with multi-turn tool-calling episodes whose
trajectories carry masks and logprobs. `build_tokenizer(dir)` writes a small offline tokenizer so
the token view can show text. Run `python -m looprl.viewer.synthetic OUT` to write a demo run.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from looprl.types import EpisodeResult, Message, Task, ToolCall, Trajectory

Encode = Callable[[str], list[int]]
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
    msgs = [
        Message("system", "You solve arithmetic. Call the calculator tool when useful."),
        task.prompt[0],
        first,
        Message("tool", tool_out, tool_call_id="call_0", name="calculator"),
        final,
    ]
    ep = EpisodeResult(task=task, messages=msgs, rollout_index=g)
    ep.rewards = {"correct": float(right), "format": 1.0 if rng.random() < 0.9 else 0.0}
    ep.reward = ep.rewards["correct"] + 0.1 * ep.rewards["format"]
    ep.num_turns, ep.num_tool_calls = 2, 1
    ep.stop_reason = "done"
    if bad_tool:
        ep.tool_errors = {"exception": 1}
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
) -> Path:
    """Write a complete synthetic training run; returns `path`."""
    enc: Encode = encode or (lambda s: [])
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"model": model, "trainer": {"steps": steps, "group_size": group}, "env": "calc"}
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    rng = random.Random(seed)
    with open(path / "metrics.jsonl", "w") as mf:
        for step in range(1, steps + 1):
            skill = 0.2 + 0.7 * (1 - math.exp(-step / 8))
            eps = _episodes(rng, step, tasks, skill, group)
            write_episodes(path / "rollouts" / f"step_{step:06d}.jsonl", eps, enc)
            mf.write(json.dumps(metrics_row(rng, step, eps, eval_every)) + "\n")
            if step % eval_every == 0:
                ev = _episodes(rng, step, tasks, skill, 1)
                d = path / "eval" / f"step_{step:06d}"
                write_episodes(d / "results.jsonl", ev, enc)
                acc = sum(e.rewards["correct"] for e in ev) / len(ev)
                (d / "metadata.json").write_text(json.dumps({"summary": {"accuracy": acc}}))
    return path


def metrics_row(rng: random.Random, step: int, eps: list[EpisodeResult], every: int) -> dict:
    """One `metrics.jsonl` row with the keys the trainer writes."""
    rewards = [e.reward for e in eps]
    mean = sum(rewards) / len(rewards)
    row: dict[str, Any] = {
        "step": step,
        "wall_time": round(step * 3.5 + rng.random(), 3),
        "reward/mean": mean,
        "reward/std": (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5,
        "reward/correct": sum(e.rewards["correct"] for e in eps) / len(eps),
        "reward/format": sum(e.rewards["format"] for e in eps) / len(eps),
        "kl": 0.001 * step * (1 + 0.3 * rng.random()),
        "entropy": 1.2 * math.exp(-step / 30) + 0.05 * rng.random(),
        "clip_frac": 0.02 + 0.03 * rng.random(),
        "mismatch_kl": 1e-4 * (1 + rng.random()),
        "tokens_per_s": 900 + 100 * rng.random(),
        "time/generate": 2.0 + rng.random(),
        "time/score": 0.1,
        "time/train": 1.0 + 0.2 * rng.random(),
        "time/sync": 0.05,
        "loss": 0.1 * rng.random() - 0.05,
    }
    if step % every == 0:
        row["eval/reward"] = mean + 0.05 * rng.random()
        row["eval/accuracy"] = row["reward/correct"]
    return row


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


def hf_encoder(tok_dir: Path) -> Encode:
    """An `Encode` from a directory's `tokenizer.json` (no special-token insertion)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    return lambda s: list(tok.encode(s, add_special_tokens=False).ids) if s else []


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/synthetic")
    tok_dir = build_tokenizer(out.parent / f".{out.name}-tokenizer")
    write_run(out, encode=hf_encoder(tok_dir), model=str(tok_dir.resolve()))
    print(f"wrote {out}; view it with: looprl view {out}")
