"""The KV cache's memory budget: admissions wait for room, resizing stays within it, results are exact."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch
from test_torch_engine import SMALL, TOKENIZER, hf_greedy, make_model, prompts

from looprl.engines.admission import default_kv_budget
from looprl.engines.base import GenerationRequest
from looprl.engines.kv_model import LlamaKVModel
from looprl.engines.torch_engine import TorchEngine
from looprl.types import SamplingParams

POSITION_BYTES = (
    2 * SMALL["num_hidden_layers"] * SMALL["num_key_value_heads"] * SMALL["head_dim"] * 4
)


def watch(engine: TorchEngine) -> dict[str, int]:
    """Record the most sequences decoded together and the most bytes the cache held."""
    peak = {"active": 0, "bytes": 0}
    backend = engine.backend
    reserve, decode = backend.reserve, backend.decode

    def reserving(slots: int, length: int) -> None:
        reserve(slots, length)
        peak["bytes"] = max(peak["bytes"], backend.allocated_bytes)  # type: ignore[attr-defined]

    def decoding(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        peak["active"] = max(peak["active"], tokens.shape[0])
        return decode(tokens, positions)

    backend.reserve, backend.decode = reserving, decoding  # type: ignore[method-assign]
    return peak


async def greedy_within(budget: int, requests: int, n: int) -> tuple[TorchEngine, dict[str, int]]:
    """Decode `requests` prompts greedily for `n` tokens on an engine whose KV cache may hold
    `budget` bytes; each result must equal the one-at-a-time reference. The engine (shut down)
    and what `watch` saw."""
    llama = make_model("llama")
    engine = TorchEngine(llama, TOKENIZER, max_batch_size=64, stop_token_ids=[], device="cpu")
    engine.admission.budget = engine.backend.max_bytes = budget
    peak = watch(engine)
    ps, sampling = prompts(requests), SamplingParams(max_tokens=n, temperature=0.0)
    try:
        gens = await asyncio.gather(
            *(engine.generate(GenerationRequest(prompt_ids=p, sampling=sampling)) for p in ps)
        )
    finally:
        engine.shutdown()
    assert [g.token_ids for g in gens] == [hf_greedy(llama, p, n) for p in ps]
    return engine, peak


async def test_requests_past_the_budget_wait_and_every_result_is_exact() -> None:
    # 1 MB holds 8 slots of 256 positions (the model's context) at 512 bytes a position
    engine, peak = await greedy_within(2**20, requests=20, n=6)
    assert peak["active"] == 8 and peak["bytes"] <= 2**20 and engine.stats.kv_waits > 0


async def test_one_request_larger_than_the_budget_still_runs_alone() -> None:
    _, peak = await greedy_within(1000, requests=3, n=4)  # under one slot's cache
    assert peak["active"] == 1


def test_kv_cache_mb_sets_the_budget_in_mib() -> None:
    engine = TorchEngine(make_model("llama"), TOKENIZER, device="cpu", kv_cache_mb=3)
    engine.shutdown()
    assert engine.admission.budget == engine.backend.max_bytes == 3 * 2**20


def test_resizing_past_the_budget_fits_the_request_alone_and_keeps_the_live_cache() -> None:
    model = make_model("llama")
    model.config.max_position_embeddings = 1024
    kv = LlamaKVModel(model, max_slots=64, max_seq_len=1024)
    kv.max_bytes = 4 * 512 * POSITION_BYTES
    assert kv.position_bytes == POSITION_BYTES
    kv.reserve(8, 100)  # doubling from nothing: 8 x 256, within the budget
    assert kv.allocated_bytes == 8 * 256 * POSITION_BYTES
    live = [torch.randn_like(layer) for layer in kv.k]
    for layer, values in zip(kv.k, live, strict=True):
        layer.copy_(values)
    kv.reserve(3, 300)  # doubling would hold 8 x 512: over, so 4 x 512
    assert kv.allocated_bytes == 4 * 512 * POSITION_BYTES == kv.cache_bytes(3, 300)
    for layer, values in zip(kv.k, live, strict=True):
        assert torch.equal(layer[:3, :, :256], values[:3])
        assert not layer[:3, :, 256:].any()


def test_the_budget_must_be_positive_and_defaults_to_a_quarter_of_memory() -> None:
    with pytest.raises(ValueError, match="kv_cache_mb must be >= 1"):
        TorchEngine(make_model("llama"), TOKENIZER, kv_cache_mb=0)
    budget = default_kv_budget(torch.device("cpu"))
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < budget <= ram // 4
