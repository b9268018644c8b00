"""Shared test helpers: the small Llama, tiny-model training runs, scripted episodes, hostile text.

Test modules import these from here (`from helpers import ...`); fixtures stay in `conftest.py`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from looprl.engines.scripted import Script, ScriptedEngine
from looprl.envs.base import Environment
from looprl.probe.tokens import token_problems
from looprl.rendering.renderer import Renderer
from looprl.rollout.loop import rollout
from looprl.trainer.config import TrainConfig, load_config
from looprl.types import EpisodeResult, Task, ToolCall

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

CHROMIUM = Path("/usr/bin/chromium")  # Debian's, for the `browser` tests (`make chromium`)
LENGTH_ENV = str(Path(__file__).parent / "envs" / "length_env.py")
VOLATILE = ("wall_time", "time/", "rollout/tokens_per_s", "train/tokens_per_s")  # differ run to run
LOGPROB = -0.5  # the logprob the scripted engine reports for every sampled token

# -- models ----------------------------------------------------------------------------------


def family_tokenizer(name: str) -> Any:
    """The tiny tokenizer dressed as model family `name`, with its typed-in chat template
    (`tests/data/templates/families.py`, loaded by path: the folder is not a package)."""
    import importlib.util

    path = Path(__file__).parent / "data" / "templates" / "families.py"
    spec = importlib.util.spec_from_file_location("families", path)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.family_tokenizer(name)


def small_llama(seed: int = 0, **config: Any) -> LlamaForCausalLM:
    """A randomly initialised small Llama (2 layers, 4 heads, 2 KV heads, width 32) for tests.

    The one model fixture of the suite: `config` overrides any `LlamaConfig` field (vocabulary,
    width, tied embeddings, special ids), and the same seed gives the same weights.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    base = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(LlamaConfig(**{**base, **config}))


def small_model(seed: int = 0) -> LlamaForCausalLM:
    """`small_llama` with a 50-token vocabulary and pad id 0: the loss and update tests' model."""
    return small_llama(seed, vocab_size=50, pad_token_id=0)


# -- tiny-model training runs ------------------------------------------------------------------


def small_config(tmp_path: Path, name: str, **overrides: Any) -> TrainConfig:
    """A 2-step run config on the tiny model and the length environment, written under `tmp_path`.

    2 tasks x 2 rollouts a step, no eval, a checkpoint at step 2; `overrides` are dotted keys
    (`{"trainer.steps": 4}`) applied on top.
    """
    base = {
        "model.name": "tiny",
        "env.name": LENGTH_ENV,
        "env.kwargs": {},
        "rollout.tasks_per_step": 2,
        "rollout.rollouts_per_task": 2,
        "trainer.steps": 2,
        "trainer.eval_every": 0,
        "trainer.eval_tasks": 2,
        "trainer.save_every": 2,
        "trainer.save_rollouts": 2,
        "optim.lr": 1e-3,
        "run.output_dir": str(tmp_path),
        "run.name": name,
        "run.tensorboard": False,
    }
    base.update(overrides)
    return load_config(None, base)


def read_metrics(run_dir: Path) -> list[dict]:
    """Every row of a run's `metrics.jsonl`; a line that is not JSON fails the test."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def stable(row: dict) -> dict:
    """A metrics row without its timing keys (`VOLATILE`), for comparing two runs exactly."""
    return {k: v for k, v in row.items() if not any(k.startswith(p) or k == p for p in VOLATILE)}


# -- scripted episodes -------------------------------------------------------------------------


async def run_episode(
    env: Environment, task: Task, script: Script, tokenizer: Any | None = None
) -> EpisodeResult:
    """One scripted rollout of `task`, scored by the rubric of the environment that runs it."""
    engine = ScriptedEngine(script, tokenizer, logprob=LOGPROB)
    renderer = Renderer(tokenizer, env.tool_schemas) if tokenizer is not None else None
    episode = await rollout(env, engine, task, renderer=renderer)
    if not episode.rollout_error:
        await env.for_task(task).rubric.score(episode)
    return episode


def check_token_invariants(episode: EpisodeResult, env: Environment, tokenizer: Any) -> None:
    """Mask 1 exactly on sampled tokens, 0 elsewhere, and the tokens decode to the conversation.

    Decoding the trajectory must give the chat template's rendering of the conversation in which
    each assistant message is the raw text the model sampled (the template's closing newline after
    the last turn is the only difference).
    """
    assert not episode.errors, episode.errors
    assert len(episode.trajectories) == 1, "no template break is expected with the tiny template"
    assert not (problems := token_problems(episode, env, tokenizer)), problems
    traj = episode.trajectories[0]
    for mask, lp in zip(traj.mask, traj.logprobs, strict=True):
        assert lp == (LOGPROB if mask else 0.0)


# -- hostile model text (the fuzz tests) -------------------------------------------------------
# Seeded: tool-call blocks with broken, strict-JSON-breaking, deep or huge JSON, lone surrogates
# (escaped and raw), near-miss tags, control characters; the same seed gives the same texts.

TOOL_NAMES = ["calculate", "nosuch", "", "calc ulate", "\u0000", "caLculate"]

_ATOMS = [
    "\\ud800",
    "\\udfff",
    "\\ud83d\\ude00",  # a valid pair written as two escapes
    "\\u0000",
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "9" * 5000,
    "-0",
    "1.5e-400",
    "true",
    "null",
    '"\\"\\\\"',
]

_RAW = ["\ud800", "\udc00", "\x00", "\x1b[31m", "\u202e", "\ufeff", "😀", "\r\n", "\t", "</", "<"]

_TAGS = [
    "<tool_call>",
    "</tool_call>",
    "<TOOL_CALL>",
    "< tool_call >",
    "<tool-call>",
    "</Tool_Call>",
    "<toolcall/>",
    "<tool_call >",
]


def random_json(rng: random.Random, depth: int = 0) -> str:
    """A JSON-ish value: mostly valid, often strict-JSON-breaking, sometimes garbage."""
    roll = rng.random()
    if depth > 4 or roll < 0.35:
        return rng.choice(
            [*_ATOMS, json.dumps(rng.choice(["2+2", "x", "7*6", ""])), str(rng.randint(-9, 99))]
        )
    if roll < 0.45:
        n = rng.choice([40, 1000, 100_000])
        return "[" * n + "1" + "]" * rng.choice([0, n])
    if roll < 0.7:
        items = [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
        return "[" + ",".join(items) + "]"
    keys = [rng.choice(['"expression"', '"a"', '"\\ud800"', '""', '"arguments"']) for _ in range(3)]
    body = ",".join(f"{k}: {random_json(rng, depth + 1)}" for k in keys[: rng.randint(0, 3)])
    return "{" + body + ("" if rng.random() < 0.1 else "}")


def random_call(rng: random.Random) -> str:
    """One tool-call block, well-formed or not."""
    name = json.dumps(rng.choice(TOOL_NAMES))
    if rng.random() < 0.2:
        name = rng.choice(['"\\ud800"', "NaN", "[1]", "null"])
    args = random_json(rng)
    if rng.random() < 0.3:
        args = json.dumps(args)  # double-encoded
    key = rng.choice(["arguments", "parameters", "arguments"])
    body = "{" + f'"name": {name}, "{key}": {args}' + "}"
    if rng.random() < 0.1:
        body = rng.choice([random_json(rng), "{" + f'"{key}": {args}' + "}"])  # no object, no name
    open_tag, close_tag = "<tool_call>", "</tool_call>"
    if rng.random() < 0.2:
        open_tag, close_tag = rng.choice(_TAGS), rng.choice(_TAGS)
    if rng.random() < 0.1:
        close_tag = ""
    return f"{open_tag}\n{body}\n{close_tag}"


def model_text(rng: random.Random, *, raw_surrogates: bool = True) -> str:
    """One assistant turn of hostile text (raw lone surrogates only when `raw_surrogates`).

    Token-level engines decode valid Unicode, so their text never holds a raw lone surrogate;
    message-level engines return whatever a server's JSON said, which can.
    """
    parts: list[str] = []
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.45:
            parts.append(random_call(rng))
        elif roll < 0.6:
            parts.append(rng.choice(_TAGS))
        elif roll < 0.8:
            raw = [r for r in _RAW if raw_surrogates or not ("\ud800" <= r <= "\udfff")]
            parts.append("".join(rng.choice(raw) for _ in range(rng.randint(1, 5))))
        else:
            parts.append(rng.choice(["The answer is 4.", "4", "", "answer: \\ud800", "{"]))
    return " ".join(parts)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first.
        b: second.
    """
    return a + b


def tool_call(name: str, i: int, **arguments: Any) -> ToolCall:
    """A structured call of tool `name` with id `call_i`."""
    return ToolCall(name=name, arguments=arguments, id=f"call_{i}")


# -- installed environment packages ----------------------------------------------------------


def write_dist_info(site: Path, package: str, version: str, entry_points: dict[str, str]) -> Path:
    """Make `package` look installed under `site` (what pip writes, less the record files): a
    `PACKAGE-VERSION.dist-info` holding METADATA and `entry_points.txt`, whose group
    `looprl.environments` maps each name of `entry_points` to its `module:object`.
    `importlib.metadata` finds it once `site` is on `sys.path`."""
    info = site / f"{package.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    lines = [f"{name} = {target}" for name, target in entry_points.items()]
    (info / "entry_points.txt").write_text("[looprl.environments]\n" + "\n".join(lines) + "\n")
    return info


def train_two_steps(tmp_path: Path, env_name: str, env_kwargs: dict) -> list[dict]:
    """Two training steps of the tiny model on `env_name`; asserts the weights moved, returns
    the metrics rows."""
    import asyncio

    import torch

    from looprl.trainer.trainer import Trainer

    cfg = load_config(
        None,
        {
            "model.name": "tiny", "env.name": env_name, "env.kwargs": env_kwargs,
            "rollout.tasks_per_step": 2, "rollout.rollouts_per_task": 2, "trainer.steps": 2,
            "trainer.eval_every": 0, "trainer.eval_tasks": 2, "trainer.save_every": 2,
            "optim.lr": 1e-3, "run.output_dir": str(tmp_path), "run.name": "foreign",
            "run.tensorboard": False,
        },
    )  # fmt: skip
    trainer = Trainer(cfg)
    trainer._setup()
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.resume = True  # _setup already ran; drive the loop directly
    asyncio.run(trainer._loop())
    trainer.logger.close()
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())
    lines = (trainer.run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]
