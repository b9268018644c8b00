"""Shared fixtures: offline mode, the tiny model (loaded once per session), viewer servers.

Tests marked `vllm` or `browser` are skipped, with the make target to run, where the vLLM venv
or Chromium is missing.

Helpers that are plain functions (models, configs, scripted episodes) live in `helpers.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip the `vllm` and `browser` tests where what they need is absent, saying how to get it."""
    from helpers import CHROMIUM

    from looprl.engines.vllm_venv import VLLMSetupError, vllm_python

    missing: dict[str, str] = {}
    try:
        vllm_python(install=False)
    except VLLMSetupError as e:
        missing["vllm"] = str(e)
    if not CHROMIUM.exists():
        missing["browser"] = f"no Chromium at {CHROMIUM}: run `make chromium`"
    for item in items:
        for marker, reason in missing.items():
            if item.get_closest_marker(marker):
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) of the tiny model, loaded once per test session."""
    from looprl.models.loading import load_model

    return load_model("tiny", device="cpu")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny):
    """The tiny model's tokenizer (with looprl's tool-capable ChatML template)."""
    return tiny[1]


@pytest.fixture
def viewer_server():
    """Start `looprl view` servers on the given paths (returns each URL); all close at the end."""
    from looprl.viewer import start_server

    started = []

    def start(*paths: Path, tokenizer: str | None = None) -> str:
        srv, url = start_server(list(paths), tokenizer=tokenizer)
        started.append(srv)
        return url

    yield start
    for srv in started:
        srv.close()
