"""The TRL side of benchmarks/vs_trl.py, and the held-out evaluator both sides are scored with.

Standalone on purpose: it imports only trl, transformers, torch and the standard library (trl
and transformers lazily, inside functions) plus looprl's stdlib-only `looprl/envs/arithmetic.py`
loaded by path, so it runs in the isolated TRL venv, and
vs_trl.py can import its reward functions into looprl's venv to check they agree with
looprl's. Two commands, each reading a JSON spec and writing a JSON result:

    python benchmarks/trl_worker.py train SPEC.json OUT.json   # GRPO with TRL's GRPOTrainer
    python benchmarks/trl_worker.py eval SPEC.json OUT.json    # greedy held-out accuracy of checkpoints

The reward is the calculator's: the number after "answer is" (else the last number) must equal
the reference exactly. The single-turn task also accepts a first turn whose `calculate` call
evaluates to the reference (the turn is scored without running the tool).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import resource
import sys
import time
from pathlib import Path
from typing import Any

_ANSWER_RE = re.compile(r"answer is\s*(-?[\d,]+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_TIED = ("model.embed_tokens.weight", "lm_head.weight")


def _load_arithmetic() -> Any:
    """looprl's stdlib-only evaluator, loaded by path: this venv has no looprl installed."""
    path = Path(__file__).parents[1] / "looprl" / "envs" / "arithmetic.py"
    spec = importlib.util.spec_from_file_location("looprl_arithmetic", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ARITH = _load_arithmetic()  # the same safe_eval / calculate as looprl's calculator tool


# ------------------------------------------------------------------ task logic (stdlib only)
def calculate(expression: str):  # type: ignore[no-untyped-def]  # no "-> str": see below
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression, e.g. (12 + 3) * 4.
    """
    # transformers turns a return annotation into a "return" key of the tool schema, which
    # looprl's schema (and so the rendered prompt) does not have
    return _ARITH.calculate(expression)


def extract_answer(text: str) -> str | None:
    """The number after 'answer is', else the last number in `text`, commas removed."""
    match = _ANSWER_RE.search(text)
    if match:
        return match.group(1).replace(",", "")
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def answer_reward(reply: str, answer: str) -> float:
    """1.0 when the final reply's answer equals the reference exactly (the calculator's reward)."""
    return float(extract_answer(reply) == answer)


def tool_calls(text: str) -> list[dict[str, Any]]:
    """The `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks of `text` that parse."""
    calls = []
    for body in _CALL_RE.findall(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and isinstance(call.get("arguments"), dict):
            calls.append(call)
    return calls


def strip_calls(text: str) -> str:
    """`text` without its tool-call blocks (the message content a parser leaves)."""
    return _CALL_RE.sub("", text).strip()


def first_turn_reward(text: str, answer: str) -> float:
    """Single-turn task: 1.0 when the turn calls `calculate` on a right expression or states the answer."""
    for call in tool_calls(text):
        if call.get("name") == "calculate":
            try:
                if calculate(str(call["arguments"].get("expression", ""))) == answer:
                    return 1.0
            except (ValueError, ZeroDivisionError, OverflowError):
                pass
    return answer_reward(strip_calls(text), answer)


# ------------------------------------------------------------------ TRL training
def _setup_torch(threads: int) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    torch.set_num_threads(threads)


def _dataset(spec: dict[str, Any], tokenizer: Any) -> Any:
    """Train rows in the order looprl draws them; single-turn prompts are pre-rendered text."""
    from datasets import Dataset

    rows = []
    for row in spec["train"]:
        if spec["task"] == "single":
            prompt: Any = tokenizer.apply_chat_template(
                row["messages"], tools=[calculate], tokenize=False, add_generation_prompt=True
            )
        else:
            prompt = row["messages"]
        rows.append({"prompt": prompt, "answer": row["answer"]})
    return Dataset.from_list(rows)


def _text_of(completion: Any) -> tuple[str, str]:
    """(whole raw text, final reply) of one TRL completion (a string or a list of messages)."""
    if isinstance(completion, str):
        return completion, strip_calls(completion)
    final = ""
    for msg in completion:
        if msg.get("role") == "assistant":
            final = str(msg.get("content") or "")
    return json.dumps(completion), final


def _make_trainer(spec: dict[str, Any], log: dict[str, list[float]]) -> Any:
    """A GRPOTrainer set up as the spec says, timing generation and counting tokens into `log`."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    class TimedGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            mask = out["completion_mask"]
            if "tool_mask" in out:
                mask = mask * out["tool_mask"]
            log["generate_s"].append(time.perf_counter() - t0)
            log["gen_tokens"].append(float(mask.sum()))
            return out

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            log["step_s"].append(time.perf_counter() - self.t0)
            if spec["save_every"] and state.global_step % spec["save_every"] == 0:
                path = Path(spec["save_dir"]) / f"step_{state.global_step:06d}.safetensors"
                save_model(kw["model"], str(path))

    def reward(prompts: Any, completions: Any, answer: list[str], **kw: Any) -> list[float]:
        texts = [_text_of(c) for c in completions]
        if spec["task"] == "single":
            scores = [first_turn_reward(raw, a) for (raw, _), a in zip(texts, answer, strict=True)]
        else:
            scores = [answer_reward(final, a) for (_, final), a in zip(texts, answer, strict=True)]
        log["reward"].append(sum(scores) / len(scores))
        return scores

    batch = spec["prompts_per_step"] * spec["generations"]
    config = GRPOConfig(
        output_dir=spec["save_dir"], max_steps=spec["steps"], per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        num_generations=spec["generations"], max_completion_length=spec["max_tokens"],
        learning_rate=spec["lr"], adam_beta1=spec["beta1"], adam_beta2=spec["beta2"],
        adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=spec["grad_clip"],
        lr_scheduler_type="constant", warmup_steps=0, beta=0.0, loss_type="grpo",
        scale_rewards="group", epsilon=0.2, temperature=spec["temperature"], top_p=1.0, top_k=0,
        shuffle_dataset=False, disable_dropout=True, use_cpu=True, bf16=False, fp16=False,
        seed=spec["seed"], report_to="none", logging_steps=1, save_strategy="no",
        max_tool_calling_iterations=spec["max_turns"] - 1 if spec["task"] == "multi" else None,
        dataloader_num_workers=0,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    if spec["task"] == "multi":
        # looprl's template writes hermes/ChatML tool calls, the format of TRL's Qwen3 parser
        tokenizer.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype="float32")
    trainer = TimedGRPOTrainer(
        model=model, reward_funcs=[reward], args=config, train_dataset=_dataset(spec, tokenizer),
        processing_class=tokenizer, tools=[calculate] if spec["task"] == "multi" else None,
        callbacks=[StepClock()],
    )  # fmt: skip
    return trainer


def train(spec: dict[str, Any]) -> dict[str, Any]:
    """Run GRPO with TRL; per-step seconds, generation seconds, tokens and rewards."""
    _setup_torch(spec["threads"])
    import torch
    import transformers
    import trl

    Path(spec["save_dir"]).mkdir(parents=True, exist_ok=True)
    log: dict[str, list[float]] = {"step_s": [], "generate_s": [], "gen_tokens": [], "reward": []}
    trainer = _make_trainer(spec, log)
    first = spec["train"][0]["messages"]
    prompt_ids = trainer.processing_class.apply_chat_template(
        first, tools=[calculate], tokenize=True, add_generation_prompt=True, return_dict=False
    )
    trainer.train()
    steps = [
        {
            "step": i + 1, "step_s": log["step_s"][i], "generate_s": log["generate_s"][i],
            "train_s": log["step_s"][i] - log["generate_s"][i], "gen_tokens": log["gen_tokens"][i],
            "train_tokens": log["gen_tokens"][i], "reward": log["reward"][i],
        }
        for i in range(len(log["step_s"]))
    ]  # fmt: skip
    versions = {"trl": trl.__version__, "transformers": transformers.__version__}
    versions["torch"] = torch.__version__
    versions["torch_threads"] = str(torch.get_num_threads())
    return {
        "steps": steps,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "prompt_ids": list(prompt_ids),
        "versions": versions,
        "replaced_template": trainer.chat_template is not None,
    }


# ------------------------------------------------------------------ shared held-out evaluator
def _load(model_dir: str, weights: str | None) -> tuple[Any, Any]:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if weights:
        state = load_file(weights)
        for a, b in (_TIED, _TIED[::-1]):  # tied embeddings are saved once, under either name
            if a not in state and b in state:
                state[a] = state[b]
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or missing:
            raise ValueError(f"{weights}: missing {missing}, unexpected {unexpected}")
    return model.eval(), tokenizer


def _greedy(
    model: Any, tokenizer: Any, convs: list[list[dict]], tools: Any, max_tokens: int
) -> list[str]:
    """One greedy assistant turn for each conversation (batched, left-padded)."""
    import torch

    texts = [
        tokenizer.apply_chat_template(c, tools=tools, tokenize=False, add_generation_prompt=True)
        for c in convs
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


def heldout_accuracy(model: Any, tokenizer: Any, spec: dict[str, Any]) -> float:
    """Greedy accuracy on the held-out tasks; the multi-turn task runs `calculate` between turns."""
    convs = [list(row["messages"]) for row in spec["eval"]]
    answers = [row["answer"] for row in spec["eval"]]
    if spec["task"] == "single":
        replies = _greedy(model, tokenizer, convs, [calculate], spec["max_tokens"])
        return sum(map(first_turn_reward, replies, answers)) / len(answers)
    final = [""] * len(convs)
    live = list(range(len(convs)))
    for _turn in range(spec["max_turns"]):
        replies = _greedy(
            model, tokenizer, [convs[i] for i in live], [calculate], spec["max_tokens"]
        )
        still = []
        for i, text in zip(live, replies, strict=True):
            calls = [c for c in tool_calls(text) if c.get("name") == "calculate"]
            final[i] = strip_calls(text)
            msg: dict[str, Any] = {"role": "assistant", "content": final[i]}
            if not calls:
                convs[i].append(msg)
                continue
            msg["tool_calls"] = [{"type": "function", "function": c} for c in calls]
            convs[i].append(msg)
            for c in calls:
                try:
                    result = calculate(str(c["arguments"].get("expression", "")))
                except (ValueError, ZeroDivisionError, OverflowError) as exc:
                    result = f"error: {exc}"
                convs[i].append({"role": "tool", "name": "calculate", "content": result})
            still.append(i)
        live = still
        if not live:
            break
    return sum(map(answer_reward, final, answers)) / len(answers)


def evaluate(spec: dict[str, Any]) -> dict[str, Any]:
    """Held-out accuracy of each checkpoint in spec['checkpoints'] ({key: weights or None})."""
    _setup_torch(spec["threads"])
    out = {}
    for key, weights in spec["checkpoints"].items():
        model, tokenizer = _load(spec["model"], weights)
        out[key] = heldout_accuracy(model, tokenizer, spec)
    return {"accuracy": out}


COMMANDS = {"train": train, "eval": evaluate}


def main() -> None:
    """`trl_worker.py COMMAND SPEC.json OUT.json`."""
    if len(sys.argv) != 4 or sys.argv[1] not in COMMANDS:
        raise SystemExit(f"usage: trl_worker.py {{{','.join(COMMANDS)}}} SPEC.json OUT.json")
    spec = json.loads(Path(sys.argv[2]).read_text())
    result = COMMANDS[sys.argv[1]](spec)
    Path(sys.argv[3]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
