"""Build engines: one factory for `looprl eval`, `looprl train` and the demo.

`make_engine` builds an engine of a given kind around what the caller already has (an
in-process model, or a server URL); `make_policy` is the command line's path: it loads the
model named by `--model` first (or points at `--base-url`); `vllm_engine` is the one place a
`VLLMEngine` is built; `side_engine` builds a model beside the policy (a judge, a simulated
user). The trainer builds its engine through `looprl.engines.placement`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from looprl.engines.base import Engine, TrainableEngine
from looprl.engines.config import EngineSection

if TYPE_CHECKING:
    from looprl.engines.vllm_engine import VLLMEngine

EngineKind = Literal["torch", "openai", "vllm"]


@dataclass
class Policy:
    """An engine plus, for in-process models, the model and tokenizer it samples from."""

    engine: Engine
    model: Any = None
    tokenizer: Any = None
    name: str = ""


def make_engine(
    kind: EngineKind,
    *,
    model: Any = None,
    tokenizer: Any = None,
    model_name: str = "",
    base_url: str | None = None,
    api_key: str | None = None,
    max_concurrency: int = 32,
    max_batch_size: int = 64,
    seed: int = 0,
    model_dir: str | None = None,
    base_urls: list[str] | None = None,
    num_servers: int = 1,
    max_model_len: int = 2048,
    startup_timeout: float = 300.0,
    kv_cache_mb: int | None = None,
) -> Engine:
    """An engine of `kind`: `torch` samples in process from `model`; `openai` talks to `base_url`
    (message level, serving `model_name`); `vllm` samples token ids from vLLM servers, started
    on `model_dir` (`num_servers` of them) or given as `base_urls`."""
    if kind == "vllm":
        servers = EngineSection(
            kind="vllm", base_urls=base_urls or [], num_servers=num_servers,
            max_concurrency=max_concurrency, startup_timeout=startup_timeout,
        )  # fmt: skip
        return vllm_engine(
            tokenizer, servers, model_dir=model_dir, max_model_len=max_model_len, seed=seed
        )
    if kind == "openai":
        if not base_url:
            raise ValueError("an openai engine needs base_url (the server's /v1 URL)")
        from looprl.engines.openai_engine import OpenAIEngine

        return OpenAIEngine(base_url, model_name, api_key=api_key, max_concurrency=max_concurrency)
    if kind == "torch":
        if model is None or tokenizer is None:
            raise ValueError("a torch engine needs the model and tokenizer it samples from")
        from looprl.engines.torch_engine import TorchEngine

        return TorchEngine(
            model, tokenizer, max_batch_size=max_batch_size, seed=seed, kv_cache_mb=kv_cache_mb
        )
    raise ValueError(f"unknown engine kind {kind!r}; choose one of ['openai', 'torch', 'vllm']")


def side_engine(
    kind: str, model: str, base_url: str | None, max_concurrency: int, timeout_s: float
) -> tuple[Any, Any]:
    """(engine, tokenizer) of a model beside the policy (a judge, a simulated user): an OpenAI-
    compatible server (`kind="openai"`, tokenizer None) or a local model in process (`"torch"`).

    Each request to a server is tried once: the judge retries on its own, and a simulated user's
    failed reply is an error of its episode.
    """
    if kind == "openai":
        from looprl.engines.openai_engine import OpenAIEngine

        engine = OpenAIEngine(
            base_url or "", model, max_concurrency=max_concurrency, timeout=timeout_s,
            max_retries=0,
        )  # fmt: skip
        return engine, None
    from looprl.engines.torch_engine import TorchEngine
    from looprl.models.loading import load_model

    weights, tokenizer = load_model(model)
    return TorchEngine(weights, tokenizer, max_batch_size=max_concurrency), tokenizer


def make_trainable_engine(kind: EngineKind, **kwargs: Any) -> TrainableEngine:
    """`make_engine` for the trainer: the engine must take weight updates (`TrainableEngine`)."""
    engine = make_engine(kind, **kwargs)
    if not isinstance(engine, TrainableEngine):
        raise ValueError(
            f"the {kind!r} engine cannot be trained (it takes no weight updates); train with the "
            "torch engine"
        )
    return engine


def make_policy(
    model: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    max_concurrency: int = 32,
    max_batch_size: int = 64,
    seed: int = 0,
    device: str | None = None,
    engine: EngineSection | None = None,
    max_model_len: int = 2048,
) -> Policy:
    """`--base-url` gives a message-level OpenAI engine; otherwise load `model` and sample it in
    process (TorchEngine) or, with `engine.kind = "vllm"`, on vLLM servers started on it.

    `model` is `tiny`, `smollm2-135m`, or a local Hugging Face model directory.
    """
    if base_url:
        client = make_engine(
            "openai", model_name=model, base_url=base_url, api_key=api_key,
            max_concurrency=max_concurrency,
        )  # fmt: skip
        return Policy(engine=client, name=model)
    from looprl.models.loading import load_model

    hf_model, tokenizer = load_model(model, device=device)
    if engine is not None and engine.kind == "vllm":
        served = vllm_engine(
            tokenizer, engine, model=hf_model, max_model_len=max_model_len, seed=seed
        )
        return Policy(engine=served, tokenizer=tokenizer, name=model)
    sampler = make_engine(
        "torch", model=hf_model, tokenizer=tokenizer, max_batch_size=max_batch_size, seed=seed,
        kv_cache_mb=engine.kv_cache_mb if engine is not None else None,
    )  # fmt: skip
    return Policy(engine=sampler, model=hf_model, tokenizer=tokenizer, name=model)


def vllm_engine(
    tokenizer: Any,
    engine: EngineSection,
    *,
    max_model_len: int,
    seed: int,
    model: Any = None,
    model_dir: str | Path | None = None,
    lora_rank: int | None = None,
) -> VLLMEngine:
    """The one place a `VLLMEngine` is built: on `engine.base_urls`, or on servers it starts from
    `model_dir`, or from `model` exported to RAM (its base weights; the export is removed when the
    engine closes). With `lora_rank` the servers take LoRA adapters of that rank after each step
    instead of full weights."""
    from looprl.engines.ram_dirs import ram_dir, sweep_and_report
    from looprl.engines.vllm_engine import VLLMEngine
    from looprl.models.weights import save_base

    sweep_and_report()  # RAM that killed runs left behind, before this one takes more
    owned = []
    if model is not None and model_dir is None and not engine.base_urls:
        model_dir = ram_dir("vllm-model")  # a fresh directory: no atomic export needed
        try:
            save_base(model, tokenizer, model_dir)
        except BaseException:
            shutil.rmtree(model_dir, ignore_errors=True)
            raise
        owned.append(Path(model_dir))
    return VLLMEngine(
        model_dir, tokenizer, base_urls=engine.base_urls, num_servers=engine.num_servers,
        max_concurrency=engine.max_concurrency, max_model_len=max_model_len, seed=seed,
        startup_timeout=engine.startup_timeout, owned_dirs=owned, lora_rank=lora_rank,
    )  # fmt: skip
