"""The torch engine's fallback backend: the model's own forward and cache, one sequence at a time."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch


class HFCacheModel:
    """Fallback backend: the model's own forward and cache, one sequence at a time (any causal LM)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT
        params = inspect.signature(base.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.device = next(model.parameters()).device
        self.caches: list[Any] = []
        self.supports_prefix = False
        self.max_bytes: int | None = None  # each slot's cache grows with its own sequence
        self.position_bytes = position_bytes(model.config, next(model.parameters()).dtype)

    def reserve(self, slots: int, length: int) -> None:
        """Grow the per-slot cache list."""
        self.caches.extend([None] * (slots - len(self.caches)))

    def cache_bytes(self, slots: int, length: int) -> int:
        """At most every slot as long as `length` (each cache is as long as its sequence)."""
        return self.position_bytes * slots * length

    def prefill(
        self, prompts: list[list[int]], first_slot: int, starts: list[int] | None = None
    ) -> torch.Tensor:
        """Run each prompt alone and keep its cache."""
        if starts and any(starts):
            raise ValueError("the HF fallback backend cannot continue cached prefixes")
        rows = []
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, use_cache=True)
            self.caches[first_slot + i] = out.past_key_values
            rows.append(out.logits[0, -1])
        return torch.stack(rows)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per active slot through that slot's own cache."""
        rows = []
        for i, (tok, pos) in enumerate(zip(tokens.tolist(), positions.tolist(), strict=True)):
            ids = torch.tensor([[tok]], dtype=torch.long, device=self.device)
            pos_ids = torch.tensor([[pos]], dtype=torch.long, device=self.device)
            kwargs = {self.cache_arg: self.caches[i]}
            out = self.model(input_ids=ids, position_ids=pos_ids, use_cache=True, **kwargs)
            self.caches[i] = out.past_key_values
            rows.append(out.logits[0, -1])
        return torch.stack(rows)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Hand slot `src`'s cache object to slot `dst`."""
        self.caches[dst] = self.caches[src]

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Give slot `dst` its own deep copy of slot `src`'s cache (caches are updated in place)."""
        self.caches[dst] = copy.deepcopy(self.caches[src])

    def truncate(self, slots: int) -> None:
        """Drop the caches of finished sequences."""
        for i in range(slots, len(self.caches)):
            self.caches[i] = None

    def release(self) -> None:
        """Drop every cache."""
        self.caches = []

    def weights_changed(self) -> None:
        """Nothing to drop: the model's own forward reads its weights at every call."""

    def export_slot(self, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Not available: the model's own cache objects have no common layout."""
        raise NotImplementedError("the HF fallback backend has no prefix cache")

    def import_slot(self, slot: int, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Not available: the model's own cache objects have no common layout."""
        raise NotImplementedError("the HF fallback backend has no prefix cache")


def position_bytes(config: Any, dtype: torch.dtype) -> int:
    """Bytes of one cached position (keys and values, every layer) of a decoder whose config
    names its layers and heads the usual way; 0 when it does not (nothing to budget by)."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not (layers and heads and hidden):
        return 0
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * dtype.itemsize
