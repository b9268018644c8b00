"""Shared fixtures: offline mode, the tiny model (built once per session), a scripted engine."""

from __future__ import annotations

import os

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
