"""Models: looprl's own `tiny` model, SmolLM2-135M from its GGUF, and loading any local HF model."""

from looprl.models.cache import cache_root
from looprl.models.loading import load_model, resolve_model_path, stop_token_ids
from looprl.models.tiny import build_tiny, tiny_path

__all__ = [
    "build_tiny",
    "cache_root",
    "load_model",
    "resolve_model_path",
    "stop_token_ids",
    "tiny_path",
]
