"""Shared fixtures: offline mode, the tiny model (built once per session), a scripted engine, viewer servers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) of the tiny model, loaded once per test session."""
    from looprl.models.loading import load_model

    return load_model("tiny", device="cpu")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny):
    """The tiny model's tokenizer (with looprl's tool-capable ChatML template)."""
    return tiny[1]


def small_llama(seed: int = 0, **config):
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


@pytest.fixture
def viewer_server():
    """Start `looprl view` servers on the given paths (returns each URL); all close at the end."""
    from looprl.viewer import start_server

    started = []

    def start(*paths: Path) -> str:
        srv, url = start_server(list(paths))
        started.append(srv)
        return url

    yield start
    for srv in started:
        srv.close()
