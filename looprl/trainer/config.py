"""Typed training configuration: loaded from TOML, overridable from the command line, validated."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from looprl.engines.config import EngineSection
from looprl.rendering.formats import ParserName
from looprl.rendering.templates import check_template_choice
from looprl.sft.config import BootstrapSection
from looprl.trainer.config_names import FOREIGN_NAMES, RENAMED
from looprl.trainer.curriculum.config import CurriculumSection, HintsSection
from looprl.trainer.metrics import check_metric_name
from looprl.trainer.monitors.config import MonitorsSection

if TYPE_CHECKING:
    from looprl.algorithms.presets import AlgorithmConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSection(_Section):
    """Which model to train."""

    name: str = Field(
        "tiny", description="tiny, smollm2-135m, or a local Hugging Face model directory"
    )
    lora: bool = Field(
        False, description="train a LoRA adapter through PEFT instead of all weights"
    )
    lora_r: int = Field(16, ge=1, description="LoRA rank (16: a common default for small models)")
    lora_alpha: int = Field(32, ge=1, description="LoRA scaling alpha (2x rank, the usual choice)")
    lora_dropout: float = Field(
        0.0, ge=0, lt=1, description="LoRA dropout (0: RL updates are already noisy)"
    )
    lora_targets: list[str] = Field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        description="module names LoRA adapts (all linear layers, as in the QLoRA paper)",
    )
    gradient_checkpointing: bool = Field(
        False, description="trade compute for memory on long sequences"
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="training compute precision: bfloat16 computes in bf16 over float32 master "
        "weights (FSDP mixed precision under torchrun, autocast with one process); for GPUs, "
        "far slower on CPU",
    )
    parser: ParserName = Field(
        "auto",
        description="tool-call format the model writes: auto (detected from the chat template), "
        "harmony, hermes, llama3_json, mistral or qwen3_coder (docs/models.md)",
    )
    chat_template: str | None = Field(
        None,
        description="a Jinja chat template file replacing the tokenizer's, or looprl (a "
        "prefix-safe ChatML template: one training segment per episode)",
    )
    keep_reasoning: bool = Field(
        True,
        description="past turns keep their <think> reasoning in the prompt; false drops it as "
        "Qwen3 does, at the price of a re-rendered prompt per turn (docs/models.md)",
    )

    @field_validator("chat_template")
    @classmethod
    def _template_exists(cls, value: str | None) -> str | None:
        return check_template_choice(value)


class EnvSection(_Section):
    """Which environment to train on (or a mixture of several)."""

    name: str = Field("calculator", description="environment name, module path or .py file")
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="arguments to load_environment"
    )


class RolloutSection(_Section):
    """How batches are sampled."""

    tasks_per_step: int = Field(16, ge=1, description="prompts per step (groups)")
    rollouts_per_task: int = Field(4, ge=1, description="G: samples per prompt (GRPO groups)")
    temperature: float = Field(
        1.0, gt=0, description="sampling temperature (1.0: sample the policy itself)"
    )
    top_p: float = Field(
        1.0, gt=0, le=1, description="nucleus sampling (1.0 = off, keeps ratios unbiased)"
    )
    top_k: int = Field(0, ge=0, description="top-k sampling (0 = off)")
    max_tokens: int | None = Field(
        None, ge=1, description="max new tokens per turn (default: the environment's)"
    )
    max_concurrent_groups: int = Field(64, ge=1, description="groups rolled out at once")
    max_inflight_groups: int | None = Field(
        None, ge=1, description="streaming: a cap on groups running or queued (unset: none)"
    )
    max_refill_rounds: int = Field(
        3, ge=0, description="dynamic sampling: extra rounds to replace zero-variance groups"
    )


class AlgorithmSection(_Section):
    """The RL algorithm: a preset plus field overrides (see looprl/algorithms/presets.py)."""

    preset: str = Field(
        "grpo", description="grpo, dr_grpo, dapo, gspo, cispo, rloo, reinforce_pp or ppo"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="AlgorithmConfig fields to override"
    )
    updates_per_batch: int = Field(
        1, ge=1, description="optimizer passes over each batch (PPO epochs)"
    )

    @field_validator("overrides")
    @classmethod
    def _one_place_for_updates(cls, v: dict[str, Any]) -> dict[str, Any]:
        if "updates_per_batch" in v:
            raise ValueError(
                "updates_per_batch is a field of its own: set algorithm.updates_per_batch "
                "(--algorithm.updates_per_batch N), not algorithm.overrides.updates_per_batch"
            )
        return v

    def resolve(self, *, sampler_shares_weights: bool = False) -> AlgorithmConfig:
        """The run's algorithm: the preset, its overrides and `updates_per_batch`, validated.

        When the sampler holds the trainer's very weights (`sampler_shares_weights`, from the
        engine placement) pi_trainer / pi_sampler is 1 and truncated importance sampling is
        the identity: it is turned off then, unless `overrides` set `use_tis` themselves.
        Raises ValueError naming the field on an unknown name or a bad value.
        """
        from looprl.algorithms.presets import resolve_algorithm

        algo = resolve_algorithm(
            self.preset, updates_per_batch=self.updates_per_batch, **self.overrides
        )
        if sampler_shares_weights and "use_tis" not in self.overrides:
            algo = dataclasses.replace(algo, use_tis=False)
        return algo


class OptimSection(_Section):
    """Optimizer and schedule."""

    lr: float = Field(
        1e-5,
        gt=0,
        description="AdamW learning rate (1e-6..1e-5 for pretrained models in GRPO recipes)",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay (0: TRL GRPO default)")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1")
    beta2: float = Field(
        0.99, ge=0, lt=1, description="AdamW beta2 (0.99: common in RL fine-tuning)"
    )
    warmup_steps: int = Field(0, ge=0, description="linear warm-up steps")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="decay after warm-up"
    )
    grad_clip: float = Field(1.0, gt=0, description="max global gradient norm")
    value_lr: float | None = Field(
        None, gt=0, description="learning rate of the PPO value head (default: 10x lr)"
    )


class TrainerSection(_Section):
    """The loop: steps, batching, evaluation, checkpoints."""

    steps: int = Field(100, ge=1, description="training steps")
    seed: int = Field(0, description="seed of tasks, sampling and initialisation")
    micro_batch_tokens: int = Field(
        8192, ge=64, description="token budget of one forward/backward micro-batch"
    )
    shared_prefix: bool = Field(
        True,
        description="forward micro-batches as prefix trees: a prompt or earlier turn shared by "
        "samples is computed once per row (same loss and gradient); false: each sample padded alone",
    )
    prefix_row_tokens: int = Field(
        1024,
        ge=64,
        description="positions per prefix-tree row: attention in a row costs its length squared "
        "(1024: the fastest measured for tiny and SmolLM2-135M LoRA on CPU, docs/benchmarks.md)",
    )
    max_async_steps: int = Field(
        0,
        ge=0,
        description="bounded staleness: generate the batches of up to k later steps while step n "
        "trains (0 = on-policy; 1 = one step ahead); samples carry their "
        "policy version and older than k are dropped",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="per-token staleness bound: tokens sampled more than this many updates before "
        "the trained policy are masked out of the loss, an episode left with none is dropped "
        "(unset: max_async_steps; AReaL's bound, per token)",
    )
    streaming: bool = Field(
        False, description="start episodes continuously; a step trains the first groups to end"
    )
    in_flight_updates: bool = Field(
        True,
        description="streaming: episodes keep generating through a weight sync where the engine "
        "can swap weights between decode steps (torch, vLLM); false: the sync holds new requests "
        "and waits for those under way",
    )
    eval_every: int = Field(
        10, ge=0, description="evaluate on held-out tasks every N steps (0 = only at the end)"
    )
    eval_before: bool = Field(
        False, description="also evaluate the starting model, logged as step 0 (before/after)"
    )
    eval_tasks: int = Field(64, ge=1, description="held-out tasks per evaluation")
    eval_rollouts: int = Field(1, ge=1, description="samples per held-out task")
    eval_temperature: float = Field(1.0, ge=0, description="sampling temperature during evaluation")
    early_stop_metric: str | None = Field(
        None, description="metric key (e.g. eval/reward) that stops training"
    )
    early_stop_value: float | None = Field(
        None, description="stop once early_stop_metric >= this value"
    )
    save_every: int = Field(10, ge=1, description="checkpoint every N steps")
    max_nonfinite_steps: int = Field(
        3,
        ge=1,
        description="stop the run after this many steps in a row whose every update was skipped "
        "for a NaN or inf loss or gradient norm (one is a glitch; a few in a row is a broken run)",
    )
    max_skipped_steps: int = Field(
        3,
        ge=1,
        description="stop the run after this many steps in a row skipped because errors "
        "(infrastructure, environment, scoring) left no group with two scored episodes",
    )
    skip_uniform_steps: bool = Field(
        False,
        description="take no optimizer step on a batch with no gradient (every group scored alike, "
        "no KL, entropy or value term), where AdamW's momentum moves the weights without signal "
        "(false: step, as TRL's GRPOTrainer does; docs/results.md 'Steps without signal')",
    )
    keep_last: int = Field(2, ge=1, description="checkpoints kept on disk")
    save_rollouts: int = Field(16, ge=0, description="episodes saved per step for inspection")
    device: str | None = Field(None, description="cpu or cuda (default: cuda when available)")
    collective_timeout_s: float = Field(
        600.0,
        gt=0,
        description="under torchrun: a collective that waits longer than this ends the job with "
        "an error (a dead or hung rank); 600 s is torch's NCCL default",
    )
    main_phase_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="under torchrun: how long ranks wait for rank 0's own work (evaluation, "
        "export) before giving up; an evaluation may take far longer than one collective",
    )

    @field_validator("early_stop_metric")
    @classmethod
    def _a_metric_key(cls, v: str | None) -> str | None:
        return None if v is None else check_metric_name(v)

    @property
    def staleness_bound(self) -> int:
        """The per-token staleness bound in force: `max_staleness`, else `max_async_steps`."""
        return self.max_async_steps if self.max_staleness is None else self.max_staleness


class RunSection(_Section):
    """Where the run lives."""

    output_dir: str = Field("runs", description="parent directory of runs")
    name: str | None = Field(None, description="run name (default: ENV-PRESET-TIME)")
    tensorboard: bool = Field(True, description="write TensorBoard events")
    wandb: bool = Field(
        False,
        description="also log to Weights & Biases: metrics each step, the config, a rollouts "
        "table and the plot (needs pip install -e '.[wandb]')",
    )
    wandb_project: str = Field("looprl", description="W&B project")
    wandb_entity: str | None = Field(
        None, description="W&B entity, a user or team (default: your W&B default)"
    )
    wandb_mode: Literal["offline", "online", "disabled"] | None = Field(
        None,
        description="W&B mode (default: WANDB_MODE, else offline: nothing leaves the machine, "
        "wandb sync uploads later)",
    )
    wandb_dir: str | None = Field(
        None, description="directory of W&B's files (default: WANDB_DIR, else the run directory)"
    )
    wandb_rollouts: int = Field(
        4, ge=0, description="episodes per step in the W&B rollouts table (a few: one table a step)"
    )


class TrainConfig(_Section):
    """The whole training configuration (`looprl train CONFIG.toml`)."""

    model: ModelSection = Field(default_factory=lambda: ModelSection())
    env: EnvSection = Field(default_factory=lambda: EnvSection())
    rollout: RolloutSection = Field(default_factory=lambda: RolloutSection())
    algorithm: AlgorithmSection = Field(default_factory=lambda: AlgorithmSection())
    optim: OptimSection = Field(default_factory=lambda: OptimSection())
    trainer: TrainerSection = Field(default_factory=lambda: TrainerSection())
    engine: EngineSection = Field(default_factory=lambda: EngineSection())
    monitors: MonitorsSection = Field(default_factory=lambda: MonitorsSection())
    curriculum: CurriculumSection = Field(default_factory=lambda: CurriculumSection())
    hints: HintsSection = Field(default_factory=lambda: HintsSection())
    run: RunSection = Field(default_factory=lambda: RunSection())
    bootstrap: BootstrapSection = Field(default_factory=lambda: BootstrapSection())

    @field_validator("algorithm")
    @classmethod
    def _known_preset(cls, v: AlgorithmSection) -> AlgorithmSection:
        v.resolve()  # raises ValueError naming the choices
        return v

    @model_validator(mode="after")
    def _early_stop_pair(self) -> TrainConfig:
        t = self.trainer
        if (t.early_stop_metric is None) != (t.early_stop_value is None):
            raise ValueError(
                "trainer.early_stop_metric and trainer.early_stop_value must be set together"
            )
        return self

    @model_validator(mode="after")
    def _streaming_fits(self) -> TrainConfig:
        if self.trainer.streaming and self.trainer.max_async_steps < 1:
            raise ValueError("trainer.streaming needs trainer.max_async_steps >= 1: set it")
        if (n := self.rollout.max_inflight_groups) is not None and n < self.rollout.tasks_per_step:
            raise ValueError("rollout.max_inflight_groups < rollout.tasks_per_step: raise it")
        if self.trainer.streaming and (self.curriculum.enabled or self.hints.enabled):
            raise ValueError(
                "[curriculum] and [hints] follow the pass rate of whole batches, which streaming "
                "does not have: set trainer.streaming = false or turn them off"
            )
        return self


def foreign_name_hint(key: str, dash: str = "--") -> str:
    """`did you mean --optim.lr? learning_rate is TRL's or verifiers' name for it` for a field name of
    TRL or verifiers, or `did you mean --optim.lr?` for a looprl field placed in the wrong
    section (`trainer.lr`); an empty string for any other. `dash` is "" for a TOML key."""
    last = key.lstrip("-").split("=")[0].rsplit(".", 1)[-1].replace("-", "_").lower()
    if last in FOREIGN_NAMES:
        field, note = FOREIGN_NAMES[last]
        why = f"{last} is TRL's or verifiers' name for it" + (f"; {note}" if note else "")
        return f"did you mean {dash}{field}? {why}"
    homes = [
        f"{section}.{last}"
        for section, info in TrainConfig.model_fields.items()
        if last in getattr(info.annotation, "model_fields", {})
    ]
    if len(homes) == 1 and homes[0] != key.lstrip("-"):
        return f"did you mean {dash}{homes[0]}?"
    return ""


class ConfigError(ValueError):
    """A configuration problem, with a message naming the field and the fix."""


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--{dotted}: {key} is not a section")
    node[keys[-1]] = value


def parse_cli_overrides(items: list[str]) -> dict[str, Any]:
    """`['--optim.lr', '1e-5', '--trainer.steps=3']` -> {'optim.lr': 1e-05, 'trainer.steps': 3}."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(items):
        item = items[i]
        if not item.startswith("--") or "." not in item:
            raise ConfigError(
                f"unexpected argument {item!r}; overrides look like --section.field VALUE"
            )
        key = item[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        elif i + 1 < len(items):
            raw, i = items[i + 1], i + 2
        else:
            raise ConfigError(f"--{key} needs a value")
        try:
            out[key.replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = raw
    return out


def _did_you_mean(loc: str, kind: str, overrides: dict[str, Any]) -> str:
    """` (did you mean trainer.steps?)` for an unknown field near a known one (`--` on the CLI)."""
    if kind != "extra_forbidden":
        return ""
    dash = "--" if loc in overrides else ""
    foreign = foreign_name_hint(loc, dash)
    if foreign:
        return f" ({foreign})"
    known = list(TrainConfig.model_fields)
    for section, info in TrainConfig.model_fields.items():
        known += [f"{section}.{f}" for f in getattr(info.annotation, "model_fields", {})]
    close = difflib.get_close_matches(loc, known, n=1, cutoff=0.6)
    return f" (did you mean {dash}{close[0]}?)" if close else ""


def load_config(
    path: str | Path | None,
    overrides: dict[str, Any] | None = None,
    *,
    base: dict[str, Any] | None = None,
) -> TrainConfig:
    """Read a TOML file (or `base`, or defaults, when `path` is None), apply dotted overrides, validate.

    Errors name the field: `trainer.steps: Input should be greater than or equal to 1`.
    """
    data: dict[str, Any] = copy.deepcopy(base) if base is not None else {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p} is not valid TOML: {exc}") from exc
    for key, value in (overrides or {}).items():
        _set_path(data, key, value)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err["loc"])
            hint = RENAMED.get(loc, "") or _did_you_mean(loc, err["type"], overrides or {})
            lines.append(f"{loc}: {err['msg']}{hint}")
        raise ConfigError("invalid config:\n  " + "\n  ".join(lines)) from None


def recorded_config(run_dir: str | Path) -> dict[str, Any]:
    """The config a run was started with (the `config` record of its `config.json`).

    `looprl train --resume --run-dir DIR` without a TOML file continues with it, so a resumed run
    keeps its model, LoRA and algorithm instead of falling back to the defaults.
    """
    path = Path(run_dir) / "config.json"
    fix = "or pass the TOML config the run was started with"
    if not path.exists():
        raise ConfigError(
            f"{path} does not exist: is {run_dir} a looprl run directory? Check it, {fix}"
        )
    try:
        record = json.loads(path.read_text(encoding="utf-8"))["config"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a looprl run record ({exc!r}); {fix}") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path}: its 'config' is not a table; {fix}")
    return record
