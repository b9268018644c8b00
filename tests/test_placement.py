"""Placements: where generation runs and how the trainer's weights reach it (looprl/engines/placement.py).

Each kind is built by `make_placement` from the model and the `[engine]` section, and each is
checked where it can go wrong: the shared engine reads the trainer's very tensors, a copy samples
the new weights only after `sync`, vLLM servers (a fake one here: `FakeOpenAIServer` answers
vLLM's reload and adapter endpoints) receive the merged weights or the adapter, and an FSDP
follower never generates nor talks to a server. The one LoRA merge equals PEFT's own.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from looprl.engines.base import GenerationRequest
from looprl.engines.config import EngineSection
from looprl.engines.placement import Placement, make_placement
from looprl.models.loading import load_model
from looprl.models.weights import base_weights, merge_lora, merged_weights
from looprl.testing.fake_openai import FakeOpenAIServer
from looprl.trainer.config import load_config
from looprl.trainer.setup import wrap_lora
from looprl.types import SamplingParams

PROMPT = [1, 5, 9, 14, 3]


@dataclass(frozen=True)
class Rank:
    """A stand-in for the trainer's `Dist`: all a placement reads of the process group."""

    rank: int

    @property
    def is_main(self) -> bool:
        """Rank 0."""
        return self.rank == 0


@pytest.fixture
def model():
    """A fresh tiny model and tokenizer per test (the tests change its weights)."""
    return load_model("tiny")


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    """A fake vLLM server given by URL: it samples "ok" and records every reload."""
    with FakeOpenAIServer() as srv:
        yield srv


def lora_model(base: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """`base` under a LoRA adapter whose B is random (PEFT starts it at 0: no delta to see)."""
    peft = wrap_lora(base, load_config(None, {"model.lora": True}))
    reseed_lora_b(peft, seed)
    return peft


def reseed_lora_b(peft: torch.nn.Module, seed: int) -> None:
    """Give every LoRA B a new random value (what training the adapter does)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def peft_merge(peft: torch.nn.Module) -> dict[str, torch.Tensor]:
    """PEFT's own merge (on a copy), the oracle for ours."""
    return copy.deepcopy(peft).merge_and_unload().state_dict()


def first_token(placement: Placement) -> tuple[int, float]:
    """The greedy first token of PROMPT from the placement's engine, and its logprob."""
    request = GenerationRequest(
        prompt_ids=PROMPT, sampling=SamplingParams(max_tokens=1, temperature=0, seed=0)
    )
    gen = asyncio.run(placement.engine.generate(request))
    return gen.token_ids[0], gen.logprobs[0]


def model_logprob(model: torch.nn.Module, token: int) -> float:
    """The model's own logprob of `token` after PROMPT (temperature 1)."""
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0, -1]  # (V,)
    return float(torch.log_softmax(logits.float(), -1)[token])


def perturb(model: torch.nn.Module) -> None:
    """Change the weights in place, enough to move every next-token distribution."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("model.norm.weight"):
                p.mul_(3.0)


def test_shared_placement_samples_the_trainers_own_tensors(model) -> None:
    net, tok = model
    placement = make_placement(net, tok, EngineSection())
    try:
        assert (placement.kind, placement.shares_weights, placement.main_only) == (
            "shared", True, False,
        )  # fmt: skip
        assert not placement.in_flight_updates  # the optimizer rewrites the sampled tensors
        engine_model = placement.engine.model  # type: ignore[attr-defined]
        ptrs = {p.data_ptr() for p in net.parameters()}
        assert {p.data_ptr() for p in engine_model.parameters()} == ptrs  # the same tensors
        perturb(net)  # an optimizer step in place: no copy to send
        assert placement.sync(net, 1).keys() == {"time/sync"}
        token, logprob = first_token(placement)
        assert logprob == pytest.approx(model_logprob(net, token), abs=1e-4)
        assert placement.engine.policy_version == 1
        assert placement.final_model(net) is net
    finally:
        asyncio.run(placement.engine.close())


def test_a_copy_samples_the_new_weights_only_after_sync(model) -> None:
    """max_async_steps > 0: the engine has weights of its own, overwritten by `sync`."""
    net, tok = model
    placement = make_placement(net, tok, EngineSection(), generate_ahead=True)
    try:
        assert (placement.kind, placement.shares_weights) == ("copy", False)
        assert placement.in_flight_updates  # its own copy: a sync may land between decode steps
        before = model_logprob(net, first_token(placement)[0])
        perturb(net)
        token, stale = first_token(placement)  # still the old weights
        assert stale == pytest.approx(before, abs=1e-4)
        assert abs(model_logprob(net, token) - stale) > 1e-2  # the change is visible
        placement.sync(net, 1)
        token, fresh = first_token(placement)
        assert fresh == pytest.approx(model_logprob(net, token), abs=1e-4)
        assert placement.engine.policy_version == 1
        assert placement.final_model(net) is net  # one process: the trained model is exported
    finally:
        asyncio.run(placement.engine.close())


def test_a_lora_copy_holds_the_merged_weights_after_each_sync(model) -> None:
    net, tok = model
    peft = lora_model(net)
    placement = make_placement(peft, tok, EngineSection())
    try:
        assert (placement.kind, placement.shares_weights) == ("copy", False)
        engine_state = placement.engine.model.state_dict()  # type: ignore[attr-defined]
        for key, want in peft_merge(peft).items():
            torch.testing.assert_close(engine_state[key], want, rtol=0, atol=1e-6)
        reseed_lora_b(peft, seed=2)  # the adapter trains on
        placement.sync(peft, 1)
        engine_state = placement.engine.model.state_dict()  # type: ignore[attr-defined]
        for key, want in peft_merge(peft).items():
            torch.testing.assert_close(engine_state[key], want, rtol=0, atol=1e-6)
    finally:
        asyncio.run(placement.engine.close())


def test_the_one_lora_merge_equals_peft_merge(model) -> None:
    """The merge every path uses (single process, FSDP's gathered state dict, engine copies)."""
    peft = lora_model(model[0])
    want = peft_merge(peft)
    got = merge_lora(peft.state_dict(), peft.peft_config["default"])
    assert merged_weights(peft).keys() == got.keys() == want.keys()
    base = base_weights(peft)
    assert max(float((want[k] - base[k]).abs().max()) for k in want) > 1e-3  # real deltas
    for key in want:
        assert torch.equal(got[key], want[key]), key  # the same bits in float32


def reloads(server: FakeOpenAIServer) -> list[Path]:
    """The weight directories the engine asked the server to reload, in order."""
    bodies = [r.json for r in server.requests if r.path == "/collective_rpc"]
    return [Path(b["kwargs"]["weights_path"]) for b in bodies]


def assert_weights(directory: Path, model: torch.nn.Module) -> None:
    """The safetensors the server was told to reload hold `model`'s weights, bit for bit."""
    sent = load_file(directory / "model.safetensors")
    want = merged_weights(model)
    assert sent.keys() == want.keys()
    for key in want:
        assert torch.equal(sent[key], want[key]), key


def test_servers_get_the_trainers_weights_at_start_and_after_each_step(model, server) -> None:
    net, tok = model
    placement = make_placement(net, tok, EngineSection(kind="vllm", base_urls=[server.base_url]))
    try:
        assert (placement.kind, placement.shares_weights, placement.main_only) == (
            "servers", False, True,
        )  # fmt: skip
        placement.first_sync(net)  # a server given by URL may hold other weights
        assert len(reloads(server)) == 1 and placement.engine.policy_version == 0
        assert_weights(reloads(server)[0], net)
        perturb(net)
        placement.sync(net, 1)
        first, second = reloads(server)
        assert_weights(second, net)
        assert not first.exists()  # the previous version's folder is dropped
        assert placement.engine.policy_version == 1
        assert placement.final_model(net) is net
    finally:
        asyncio.run(placement.engine.close())


def test_lora_servers_hot_load_each_steps_adapter(model, server) -> None:
    net, tok = model
    peft = lora_model(net)
    engine = EngineSection(kind="vllm", base_urls=[server.base_url])
    placement = make_placement(peft, tok, engine)
    try:
        assert (placement.kind, placement.main_only) == ("adapters", True)
        placement.sync(peft, 3)
        (load,) = [r.json for r in server.requests if r.path == "/v1/load_lora_adapter"]
        assert load["lora_name"] == "policy-v3"
        adapter = load_file(Path(load["lora_path"]) / "adapter_model.safetensors")
        lora_b = {n: p for n, p in peft.named_parameters() if "lora_B" in n}
        assert len(adapter) == 2 * len(lora_b) > 0  # A and B of every adapted layer
        config = json.loads((Path(load["lora_path"]) / "adapter_config.json").read_text())
        assert config["r"] == peft.peft_config["default"].r
        asyncio.run(placement.engine.generate(GenerationRequest(prompt_ids=PROMPT)))
        (sampled,) = [r.json for r in server.requests if r.path == "/inference/v1/generate"]
        assert sampled["model"] == "policy-v3"  # requests name the adapter they sample with
    finally:
        asyncio.run(placement.engine.close())


def test_fsdp_rank_0_drives_the_servers_and_exports_a_full_copy(model, server) -> None:
    net, tok = model
    engine = EngineSection(kind="vllm", base_urls=[server.base_url])
    placement = make_placement(net, tok, engine, group=Rank(0))
    try:
        assert placement.kind == "servers"
        perturb(net)
        placement.sync(net, 1)
        assert_weights(reloads(server)[-1], net)
        final = placement.final_model(net)  # the copy lagged the servers: refreshed now
        assert final is not net
        for key, tensor in merged_weights(net).items():
            assert torch.equal(final.state_dict()[key], tensor), key
    finally:
        asyncio.run(placement.engine.close())


def test_an_fsdp_follower_never_generates_nor_reaches_a_server(model, server) -> None:
    net, tok = model
    engine = EngineSection(kind="vllm", base_urls=[server.base_url])
    placement = make_placement(net, tok, engine, group=Rank(1))
    assert (placement.kind, placement.main_only, placement.shares_weights) == (
        "follower", True, False,
    )  # fmt: skip
    placement.first_sync(net)
    placement.sync(net, 2)
    assert placement.engine.policy_version == 2  # the version follows rank 0's
    with pytest.raises(RuntimeError, match="only rank 0 samples"):
        asyncio.run(placement.engine.generate(GenerationRequest(prompt_ids=PROMPT)))
    assert placement.final_model(net) is net  # rank 0 exports; this rank only joins the gather
    assert server.request_count == 0


def test_an_fsdp_copy_holds_the_same_values_so_tis_is_off(model) -> None:
    """Under FSDP each rank samples from its full copy; full weights on-policy: TIS is identity."""
    net, tok = model
    placement = make_placement(net, tok, EngineSection(), group=Rank(1))
    try:
        assert (placement.kind, placement.shares_weights, placement.main_only) == (
            "copy", True, False,
        )  # fmt: skip
        perturb(net)
        placement.sync(net, 1)
        final = placement.final_model(net)  # the synced copy: rank 0 exports it
        assert final is not net
        for key, tensor in net.state_dict().items():
            assert torch.equal(final.state_dict()[key], tensor), key
    finally:
        asyncio.run(placement.engine.close())


def test_fsdp_rank_0_hot_loads_the_adapter_and_exports_the_merged_copy(model, server) -> None:
    """LoRA with vLLM under several processes: rank 0 saves the (gathered) adapter each sync."""
    net, tok = model
    peft = lora_model(net)
    engine = EngineSection(kind="vllm", base_urls=[server.base_url])
    placement = make_placement(peft, tok, engine, group=Rank(0))
    try:
        assert (placement.kind, placement.main_only) == ("adapters", True)
        reseed_lora_b(peft, seed=3)  # the adapter trains on
        placement.sync(peft, 2)
        (load,) = [r.json for r in server.requests if r.path == "/v1/load_lora_adapter"]
        assert load["lora_name"] == "policy-v2"
        sent = load_file(Path(load["lora_path"]) / "adapter_model.safetensors")
        lora = {n.replace(".default", ""): p for n, p in peft.state_dict().items() if "lora_" in n}
        assert sent.keys() == lora.keys()
        for key in lora:
            assert torch.equal(sent[key], lora[key]), key  # the adapter trained, bit for bit
        assert not [r for r in server.requests if r.path == "/collective_rpc"]  # no full weights
        final = placement.final_model(peft)  # a plain copy, refreshed with the merged weights
        assert final is not peft and not hasattr(final, "peft_config")
        for key, tensor in peft_merge(peft).items():
            torch.testing.assert_close(final.state_dict()[key], tensor, rtol=0, atol=1e-6)
    finally:
        asyncio.run(placement.engine.close())


def test_an_fsdp_follower_of_adapters_gathers_the_adapter_alone(model, server, monkeypatch) -> None:
    """Its collectives must pair with rank 0's: the LoRA tensors at a sync, everything at export."""
    import looprl.engines.placement as P

    net, tok = model
    peft = lora_model(net)
    engine = EngineSection(kind="vllm", base_urls=[server.base_url])
    gathered: list[list[str]] = []
    for name in ("adapter_weights", "merged_weights"):
        real = getattr(P, name)
        monkeypatch.setattr(P, name, lambda m, real=real: gathered.append(sorted(real(m))))
    placement = make_placement(peft, tok, engine, group=Rank(1))
    placement.sync(peft, 1)
    assert placement.kind == "follower" and placement.engine.policy_version == 1
    assert gathered[0] and all(".lora_" in k for k in gathered[0])
    placement.final_model(peft)
    assert gathered[1] == sorted(merged_weights(peft))  # rank 0 exports the merged weights
    assert server.request_count == 0


@pytest.mark.parametrize(
    ("overrides", "generate_ahead", "use_tis"),
    [({}, False, False), ({}, True, True), ({"use_tis": True}, False, True),
     ({"use_tis": False}, True, False)],
)  # fmt: skip
def test_tis_is_decided_once_from_the_overrides_and_the_placement(
    model, overrides, generate_ahead, use_tis
) -> None:
    net, tok = model
    cfg = load_config(None, {"algorithm.overrides": overrides, "algorithm.updates_per_batch": 3})
    placement = make_placement(net, tok, cfg.engine, generate_ahead=generate_ahead)
    try:
        algo = cfg.algorithm.resolve(sampler_shares_weights=placement.shares_weights)
        assert (algo.use_tis, algo.updates_per_batch) == (use_tis, 3)
    finally:
        asyncio.run(placement.engine.close())
