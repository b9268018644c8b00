"""Which KV backend a TorchEngine runs: the fast Llama-family path, or the model's own forward."""

from __future__ import annotations

import logging
from typing import Any, Literal

from looprl.engines.hf_backend import HFCacheModel
from looprl.engines.kv_model import (
    KVBackend,
    LlamaKVModel,
    UnsupportedModelError,
    sliding_window_limit,
)

logger = logging.getLogger(__name__)

Backend = Literal["auto", "kv", "hf"]


def default_max_len(model: Any) -> int:
    """Positions a sequence may reach: the model's context, or its sliding window if smaller."""
    cfg = model.config
    limit = int(getattr(cfg, "max_position_embeddings", None) or 2048)
    window = sliding_window_limit(cfg)
    return min(limit, window) if window else limit


def make_backend(
    model: Any,
    backend: Backend,
    *,
    max_slots: int,
    max_seq_len: int,
    fuse: bool,
    pack: bool = False,
) -> KVBackend:
    """`kv` (LlamaKVModel), `hf` (HFCacheModel), or `auto`: kv when the model supports it."""
    if backend not in ("auto", "kv", "hf"):
        raise ValueError(f"unknown backend {backend!r}; choose 'auto', 'kv' or 'hf'")
    if backend != "hf":
        try:
            return LlamaKVModel(
                model, max_slots=max_slots, max_seq_len=max_seq_len, fuse=fuse, pack=pack
            )
        except UnsupportedModelError as exc:
            if backend == "kv":
                raise
            logger.warning("TorchEngine: no fast path (%s); using the model's own forward", exc)
    return HFCacheModel(model)
