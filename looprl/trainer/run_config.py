"""The config a run records, and what `looprl train --resume` may change in it.

A run records its config in `config.json` with its file paths made absolute (`absolute_paths`),
so `--resume --run-dir DIR` works from any folder. A resumed run must go on training what the run
trained: `resume_changes` names every field that differs from the record, except the fields of
`SAFE_ON_RESUME`, which change how long the run goes, how often it evaluates and saves, where it
logs and how it uses memory, never what it learns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from looprl.trainer.config import TrainConfig

SAFE_ON_RESUME: dict[str, str] = {
    "trainer.steps": "extend or shorten the run (a decaying schedule follows the new total from the step reached)",
    "trainer.eval_every": "evaluation only",
    "trainer.eval_before": "evaluation only",
    "trainer.eval_tasks": "evaluation only (the held-out curve then counts other tasks)",
    "trainer.eval_rollouts": "evaluation only",
    "trainer.eval_temperature": "evaluation only",
    "trainer.early_stop_metric": "when to stop",
    "trainer.early_stop_value": "when to stop",
    "trainer.save_every": "what is written to disk",
    "trainer.keep_last": "what is written to disk",
    "trainer.save_rollouts": "what is written to disk",
    "trainer.device": "where the run computes",
    "trainer.micro_batch_tokens": "memory: the same gradient over other micro-batches",
    "trainer.shared_prefix": "speed: the same gradient, a shared prefix forwarded once",
    "trainer.prefix_row_tokens": "speed: the same gradient, shared prefixes cut at other places",
    "trainer.collective_timeout_s": "how long processes wait",
    "trainer.main_phase_timeout_s": "how long processes wait",
    "model.gradient_checkpointing": "memory: the same gradient, recomputed",
    "rollout.max_concurrent_groups": "how many groups are sampled at once",
    "engine": "where rollouts are sampled (torch or vLLM servers), not from which weights",
    "monitors": "the reward-hacking monitors only watch",
    "run": "where and how the run logs (TensorBoard, W&B)",
    "bootstrap": "read by looprl bootstrap only, never by looprl train",
}
"""Fields (or whole sections) a resumed run may change, each with the reason it is safe."""


def _absolute(text: str) -> str:
    """`text` as an absolute path when it names an existing file or folder, else unchanged."""
    path = Path(text).expanduser()
    return str(path.resolve()) if not path.is_absolute() and path.exists() else text


def _absolute_in(value: Any) -> Any:
    """Path-like strings of an `env.kwargs` value made absolute: those with a `/` or a file
    suffix (`data/q.jsonl`, `my_env.py`) that exist; a bare word (`train`) stays as written."""
    if isinstance(value, dict):
        return {k: _absolute_in(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_absolute_in(v) for v in value]
    if isinstance(value, str) and ("/" in value or Path(value).suffix):
        return _absolute(value)
    return value


def absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """A copy of `cfg` whose paths relative to the working directory are absolute: `model.name`
    when it is a local directory (not a built-in name), `model.chat_template` when it is a file,
    `env.name` when it is a `.py` file, and the existing paths among `env.kwargs`."""
    from looprl.models.loading import BUILTIN_MODELS

    model, env = cfg.model, cfg.env
    name = model.name
    if name.strip().lower() not in BUILTIN_MODELS:
        name = _absolute(name)
    template = model.chat_template
    template = _absolute(template) if template and template != "looprl" else template
    return cfg.model_copy(
        update={
            "model": model.model_copy(update={"name": name, "chat_template": template}),
            "env": env.model_copy(
                update={
                    "name": _absolute(env.name) if env.name.endswith(".py") else env.name,
                    "kwargs": _absolute_in(env.kwargs),
                }
            ),
        }
    )


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}` (lists are leaves)."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _safe(key: str) -> bool:
    return any(key == s or key.startswith(s + ".") for s in SAFE_ON_RESUME)


def resume_changes(saved: dict[str, Any], cfg: TrainConfig) -> list[str]:
    """`field: saved X, given Y` for each field of `cfg` that differs from the run's recorded
    config `saved` and that a resume may not change (see `SAFE_ON_RESUME`)."""
    try:  # the record as a config of today (defaults filled, paths absolute), when it still is one
        before = absolute_paths(TrainConfig.model_validate(saved)).model_dump()
    except ValidationError:
        before = saved
    old, new = _flat(before), _flat(cfg.model_dump())

    def show(values: dict[str, Any], key: str) -> str:
        return repr(values[key]) if key in values else "unset"

    return [
        f"{key}: saved {show(old, key)}, given {show(new, key)}"
        for key in sorted(old.keys() | new.keys())
        if not _safe(key) and show(old, key) != show(new, key)
    ]


def resume_markdown() -> str:
    """The docs' paragraph on resuming, with the table of fields a resume may change."""
    rows = "\n".join(f"| `{key}` | {why} |" for key, why in SAFE_ON_RESUME.items())
    return (
        "## Resuming a run\n\n"
        "`looprl train --resume --run-dir DIR` continues DIR from its newest checkpoint with the\n"
        "config recorded in `DIR/config.json` (file paths in it are absolute, so any working\n"
        "folder will do). Given a TOML file or `--section.field` overrides as well, it compares\n"
        "them with the record: a field that changes what the run learns (model, LoRA, environment,\n"
        "algorithm, optimizer, rollout shape, seed) is refused with one line naming each\n"
        "difference, `model.name: saved 'tiny', given 'smollm2-135m'`; `--force` continues with\n"
        "the new values. `config.json` then records the config the run goes on with. A folder\n"
        "with no checkpoint yet starts at step 0 and records its config. These fields may change\n"
        "on resume:\n\n"
        "| field or section | why it is safe |\n|---|---|\n" + rows + "\n\n"
    )
