"""Model-family tokenizers for the rendering tests, and the token cost of each template choice.

`family_tokenizer(name)` builds a tokenizer for a family of `families.json`: looprl's tiny BPE
tokenizer with the family's special and added tokens, its bos/eos and its chat template (the
`.jinja` file beside this one, typed in from the public template). Nothing is downloaded.

Run as a script, it measures what each template choice costs on multi-turn environments
(calculator: tool turns; wordle: user feedback turns) with looprl's scripted teachers writing
in each family's own tool-call format, with and without a reasoning block per turn:

    .venv/bin/python tests/data/templates/families.py [--tasks 8]

Token counts are in the tiny tokenizer's tokens (plus the family's special tokens), so they
compare templates with each other, not with the real models' tokenizers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FAMILIES: dict[str, dict[str, Any]] = {
    k: v for k, v in json.loads((HERE / "families.json").read_text()).items() if k[0] != "_"
}
REASONING = "I should check the task before I answer."
THOUGHT = f"<think>\n{REASONING}\n</think>\n\n"


def family_tokenizer(name: str, *, chat_template: str | None = None) -> Any:
    """The tiny tokenizer dressed as family `name` (its tokens, bos/eos and chat template).

    `chat_template` replaces the family's (as `--model.chat_template` does); a family whose
    template has no tool support gets looprl's ChatML template, as `load_model` gives it.
    """
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from looprl.models.tiny import tiny_path
    from looprl.rendering.templates import ensure_tool_template, set_chat_template

    family = FAMILIES[name]
    tok = AutoTokenizer.from_pretrained(tiny_path(), local_files_only=True)
    special = [AddedToken(t, special=True, normalized=False) for t in family["special"]]
    tok.add_tokens(special, special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in family["added"]])
    tok.bos_token = family["bos_token"]
    tok.eos_token = family["eos_token"]
    tok.chat_template = (HERE / family["template"]).read_text()
    ensure_tool_template(tok)
    set_chat_template(tok, chat_template)
    return tok


def call_text(parser: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    """How a model of format `parser` writes `calls` (name, arguments) in one turn."""
    if parser == "llama3_json":
        return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    if parser == "mistral":
        return "[TOOL_CALLS] " + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    if parser == "qwen3_coder":
        return "\n".join(
            f"<tool_call>\n<function={n}>\n"
            + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in a.items())
            + "</function>\n</tool_call>"
            for n, a in calls
        )
    return "\n".join(
        "<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>"
        for n, a in calls
    )


def harmony_text(turn: Any, think: bool) -> str:
    """A parsed reply as gpt-oss writes it: analysis, then its first call or its final answer,
    each closed by the token that stops the turn."""
    thought = f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant" if think else ""
    if turn.calls:
        call = turn.calls[0]
        head = f"<|channel|>commentary to=functions.{call.name} <|constrain|>json<|message|>"
        return f"{thought}{head}{json.dumps(call.arguments)}<|call|>"
    return f"{thought}<|channel|>final<|message|>{turn.content}<|return|>"


def in_format(text: str, parser: str, think: bool) -> str:
    """A teacher's Hermes-format reply rewritten in format `parser`, after a reasoning block."""
    from looprl.rendering.parser import HermesParser

    turn = HermesParser().parse(text)
    if parser == "harmony":
        return harmony_text(turn, think)
    reply = call_text(parser, [(c.name, c.arguments) for c in turn.calls]) if turn.calls else text
    return (THOUGHT if think else "") + reply


def parser_name(renderer: Any) -> str:
    """The `PARSERS` name of the parser a renderer chose."""
    from looprl.rendering.formats import PARSERS

    return next(name for name, cls in PARSERS.items() if type(renderer.parser) is cls)


async def measure(
    env_name: str, family: str, template: str | None, think: bool, tasks: int, keep: bool = True
) -> dict[str, float]:
    """Mean tokens, segments and re-rendered prompt tokens per episode of a teacher's play."""
    from looprl.engines.scripted import ScriptedEngine
    from looprl.envs.registry import load_environment
    from looprl.rendering.renderer import Renderer
    from looprl.rollout.loop import rollout
    from looprl.sft import teachers

    tok = family_tokenizer(family, chat_template=template)
    env = load_environment(env_name)
    renderer = Renderer(tok, env.tool_schemas, keep_reasoning=keep)
    policy = getattr(teachers, env_name)
    fmt = parser_name(renderer)

    def reply(request: Any) -> str:
        return in_format(policy(request.messages), fmt, think)

    stop = None if fmt == "harmony" else tok.eos_token  # harmony replies carry their own
    engine = ScriptedEngine(reply, tok, eos_token=stop)
    totals = {"turns": 0.0, "tokens": 0.0, "segments": 0.0, "re_rendered": 0.0, "errors": 0.0}
    for task in env.get_tasks("eval", tasks, seed=0):
        ep = await rollout(env, engine, task, renderer=renderer)
        totals["errors"] += len(ep.errors) + sum(ep.tool_errors.values())
        totals["turns"] += ep.num_turns
        totals["tokens"] += sum(len(t) for t in ep.trajectories)
        totals["segments"] += len(ep.trajectories)
        totals["re_rendered"] += sum(t.mask.index(1) for t in ep.trajectories[1:] if 1 in t.mask)
    return {k: v / tasks for k, v in totals.items()}


CHOICES = [
    ("gpt-oss", None, True),
    ("llama3.1", None, True),
    ("llama3.2", None, True),
    ("mistral-v0.3", None, True),
    ("qwen2.5", None, True),
    ("qwen3", None, True),
    ("qwen3", "looprl", True),
    ("qwen3", "looprl", False),
    ("smollm2", None, True),
]
"""(family, --model.chat_template, model.keep_reasoning) rows of the table; smollm2 gets
looprl's template (its own cannot render tools)."""


def main(argv: list[str] | None = None) -> int:
    """Print the cost table (markdown) of every template choice on calculator and wordle."""
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--tasks", type=int, default=8, help="episodes per cell")
    opts = args.parse_args(argv)
    print(
        "| env | family | template | keep_reasoning | reasoning | turns | tokens | segments "
        "| re-rendered |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for env_name in ("calculator", "wordle"):
        for family, template, keep in CHOICES:
            for think in (False, True) if keep else (True,):
                row = asyncio.run(measure(env_name, family, template, think, opts.tasks, keep))
                if row["errors"]:
                    print(f"errors in {env_name}/{family}: {row['errors']}", file=sys.stderr)
                shown = template or ("looprl (installed)" if family == "smollm2" else "own")
                print(
                    f"| {env_name} | {family} | {shown} | {str(keep).lower()} | "
                    f"{'yes' if think else 'no'} | "
                    f"{row['turns']:.1f} | {row['tokens']:.0f} | {row['segments']:.1f} | "
                    f"{row['re_rendered']:.0f} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
