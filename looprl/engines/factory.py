"""Build an engine from a model name or a server URL (the CLI's `--model` / `--base-url`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from looprl.engines.base import Engine


@dataclass
class Policy:
    """An engine plus, for in-process models, the model and tokenizer it samples from."""

    engine: Engine
    model: Any = None
    tokenizer: Any = None
    name: str = ""


def make_policy(
    model: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    max_concurrency: int = 32,
    max_batch_size: int = 64,
    seed: int = 0,
    device: str | None = None,
) -> Policy:
    """`--base-url` gives a message-level OpenAI engine; otherwise load `model` into a TorchEngine.

    `model` is `tiny`, `smollm2-135m`, or a local Hugging Face model directory.
    """
    if base_url:
        from looprl.engines.openai_engine import OpenAIEngine

        engine = OpenAIEngine(base_url, model, api_key=api_key, max_concurrency=max_concurrency)
        return Policy(engine=engine, name=model)
    from looprl.engines.torch_engine import TorchEngine
    from looprl.models.loading import load_model

    hf_model, tokenizer = load_model(model, device=device)
    torch_engine = TorchEngine(hf_model, tokenizer, max_batch_size=max_batch_size, seed=seed)
    return Policy(engine=torch_engine, model=hf_model, tokenizer=tokenizer, name=model)
