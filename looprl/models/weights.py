"""A policy's weights as an engine loads them: LoRA merged, FSDP shards gathered, a frozen copy.

The trainer may hold a PEFT LoRA model (`model.lora`), sharded under FSDP; an engine loads plain
Hugging Face weights under the base model's names. One merge serves every path:

- `merged_weights(model)`: the full weights, each LoRA delta `scale * B @ A` added to its base
  weight; under FSDP each shard is gathered first (a collective: every rank calls it).
- `base_weights(model)`: the weights without the adapters, as vLLM serves them under adapters.
- `adapter_weights(model)`: the LoRA tensors alone, as a PEFT adapter is saved for vLLM; under
  FSDP gathered from the shards (a collective over the adapter only, not the base weights).
- `frozen_copy(model)`: a plain, frozen model holding the merged weights (an engine's own copy,
  or the reference model of the KL penalty).
- `save_base(model, tokenizer, directory)`: a Hugging Face directory of the base weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def lora_config(model: torch.nn.Module) -> Any:
    """The PEFT `LoraConfig` of the adapter named "default", or None for a plain model."""
    peft_config = getattr(model, "peft_config", None)
    return None if peft_config is None else peft_config["default"]


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`model.state_dict()` detached, with each FSDP shard (`DTensor`) gathered to the full tensor.

    Under FSDP `full_tensor` is a collective: every rank must call this. Unsharded tensors are
    returned as they are (no copy).
    """
    return _gathered(model, lambda name: True)


def adapter_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA tensors of a PEFT model under its state-dict names, each FSDP shard gathered.

    What `save_pretrained(dir, state_dict=...)` writes as the adapter. Under FSDP `full_tensor`
    is a collective over the adapter's tensors: every rank must call this.
    """
    return _gathered(model, lambda name: ".lora_" in name)


def _gathered(model: torch.nn.Module, keep: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """The detached tensors of `model.state_dict()` whose name `keep` accepts, DTensors gathered."""
    from torch.distributed.tensor import DTensor

    return {
        name: (t.full_tensor() if isinstance(t, DTensor) else t).detach()
        for name, t in model.state_dict().items()
        if keep(name)
    }


def base_name(name: str) -> str:
    """A PEFT state-dict key under the base model's name (`base_model.model.` and `.base_layer` go)."""
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


def merge_lora(full: dict[str, torch.Tensor], lora: Any) -> dict[str, torch.Tensor]:
    """A PEFT model's full state dict with each LoRA delta (scale * B @ A) added to its weight.

    `lora` is the adapter's `LoraConfig`: scale = lora_alpha / r (lora_alpha / sqrt(r) with
    rsLoRA). Keys come under the base model's names; adapter tensors are dropped. Only the
    adapter named "default" of linear layers (what `model.lora` builds). PEFT's own merge gives
    the same bits in float32 (tests/test_placement.py).
    """
    scale = lora.lora_alpha / (lora.r**0.5 if lora.use_rslora else lora.r)
    out = {}
    for name, tensor in full.items():
        if ".lora_" in name:
            continue
        if name.endswith(".base_layer.weight"):
            stem = name.removesuffix(".base_layer.weight")
            a, b = full[f"{stem}.lora_A.default.weight"], full[f"{stem}.lora_B.default.weight"]
            delta = b @ a  # (out, r) @ (r, in) -> (out, in)
            tensor = tensor + scale * (delta.T if lora.fan_in_fan_out else delta)
        out[base_name(name)] = tensor
    return out


def merged_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's full weights under the base model's names, LoRA merged (see `merge_lora`).

    Under FSDP every rank must call it (the shards are gathered). A plain, unsharded model's
    tensors come back as they are, not copied.
    """
    full = full_state_dict(model)
    lora = lora_config(model)
    return full if lora is None else merge_lora(full, lora)


def base_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights without any adapter, under the base model's names (a plain model's state dict)."""
    full = full_state_dict(model)
    return {base_name(name): t for name, t in full.items() if ".lora_" not in name}


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain copy of the policy (LoRA merged) without gradients, for an engine or a reference."""
    if lora_config(model) is not None:
        from transformers import AutoModelForCausalLM

        config = model.get_base_model().config  # type: ignore[operator]
        plain = AutoModelForCausalLM.from_config(config)  # adapters stripped: a plain model
        plain.load_state_dict(merged_weights(model), strict=False)
        out = plain.to(next(model.parameters()).device)
    else:
        out = copy.deepcopy(model)
    out.eval()
    for p in out.parameters():
        p.requires_grad_(False)
    return out


def save_base(model: torch.nn.Module, tokenizer: Any, directory: str | Path) -> None:
    """Save the base model (a PEFT model without its adapters) and tokenizer as a Hugging Face
    directory, e.g. for vLLM servers that apply the adapters themselves."""
    if lora_config(model) is None:
        model.save_pretrained(directory)  # type: ignore[operator]
    else:
        base: Any = model.get_base_model()  # type: ignore[operator]
        base.save_pretrained(directory, state_dict=base_weights(model))
    tokenizer.save_pretrained(directory)


def copy_weights(model: torch.nn.Module, state: Any) -> None:
    """Overwrite `model`'s parameters in place with `state`'s tensors of the same names and shapes.

    Raises ValueError naming the first missing parameter or mismatched shape (and the fix);
    nothing is copied then.
    """
    targets = dict(model.named_parameters())
    missing = [name for name in targets if name not in state]
    if missing:
        raise ValueError(
            f"sync_weights: source lacks {len(missing)} parameters (first: {missing[:3]}); pass "
            "the unwrapped model (not a DDP/compiled/PEFT wrapper) or merge adapters first"
        )
    for name, param in targets.items():
        if state[name].shape != param.shape:
            raise ValueError(
                f"sync_weights: {name} has shape {tuple(state[name].shape)}, expected "
                f"{tuple(param.shape)}"
            )
    with torch.no_grad():
        for name, param in targets.items():
            param.copy_(state[name])
