"""Placement: where generation runs and how the trainer's weights reach it, chosen once at start-up.

`make_placement` reads the `[engine]` section, the model being trained (plain or PEFT LoRA),
whether batches are generated ahead of the update (`trainer.max_async_steps > 0`) and the
process group (None with one process), and returns one of five kinds. The training loop calls
`placement.sync(model, version)` after every update and never asks which kind it holds.

| kind       | when                                      | samples on                  | after each step              |
|------------|-------------------------------------------|-----------------------------|------------------------------|
| `shared`   | torch, full weights, on-policy, 1 process | the trainer's own tensors   | nothing to send              |
| `copy`     | torch with LoRA, `max_async_steps > 0`,   | a frozen copy (every rank   | the merged full weights are  |
|            | or under FSDP                             | its own, full)              | copied in (gathered: FSDP)   |
| `servers`  | vllm, full weights (rank 0 under FSDP)    | vLLM servers                | merged full weights sent     |
| `adapters` | vllm with LoRA (rank 0 under FSDP)        | vLLM servers + adapters     | the PEFT adapter hot-loaded  |
|            |                                           |                             | (gathered: FSDP)             |
| `follower` | vllm, ranks other than 0 under FSDP       | nothing: rank 0 hands out   | its part of rank 0's gather  |
|            |                                           | the batch                   | (the adapter alone: LoRA)    |

Before an update that no generation runs beside (`max_async_steps = 0`, or the pipeline empty at a
checkpoint), the trainer calls `placement.release_idle_memory()`: an in-process torch engine
(`shared`, `copy`) frees its KV-cache slots and prefix cache, which the update would otherwise
carry as dead weight (the prefix cache is emptied by the weight change anyway; the next batch
allocates the slots again). Servers keep their memory, in their own processes.

`shares_weights` is True when the sampler holds the trainer's very values (`shared`, and `copy`
under FSDP with full weights, on-policy): then pi_trainer / pi_sampler = 1 and truncated
importance sampling would be the identity. `main_only` is True when rank 0 alone generates.

`in_flight_updates` is True when `sync` may run while episodes are still generating (no drain):
their requests go on under the new weights and each token records the version that sampled it.
That holds where the engine can take weights mid-request (`TorchEngine`: `copy`) and not for
`shared`, whose optimizer step rewrites the very tensors the engine samples from; `servers` and
`adapters` follow their engine's `in_flight_updates`; a `follower` samples nothing (False).
"""

from __future__ import annotations

import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Protocol

from torch import nn

from looprl.engines.base import AdapterEngine, GenerationRequest, TrainableEngine
from looprl.engines.config import EngineSection
from looprl.engines.factory import vllm_engine
from looprl.engines.ram_dirs import sweep_and_report
from looprl.engines.torch_engine import TorchEngine
from looprl.models.weights import adapter_weights, frozen_copy, lora_config, merged_weights
from looprl.types import Generation


class ProcessGroup(Protocol):
    """This process's place among several under torchrun (the trainer's `Dist`)."""

    @property
    def is_main(self) -> bool:
        """Rank 0: it alone drives remote servers, logs and exports."""
        ...


class Placement(ABC):
    """Where generation runs and how weights reach it (see the module doc); `make_placement` builds one.

    `engine` is what rollouts sample from; `sync` after each update makes it sample the new
    weights as that policy version and returns `{"time/sync": seconds}`. `shares_weights`: the
    sampler holds the trainer's very values, so TIS would be the identity.
    """

    kind: ClassVar[str]
    main_only: ClassVar[bool] = False
    """Rank 0 alone generates and hands every rank the batch (it drives remote servers)."""
    built_from_model: ClassVar[bool] = True
    """The engine starts with the model's weights (else a fresh run sends them first)."""

    def __init__(self, engine: TrainableEngine, *, shares_weights: bool = False) -> None:
        self.engine = engine
        self.shares_weights = shares_weights

    def sync(self, model: nn.Module, version: int) -> dict[str, float]:
        """After an update: the engine samples `model`'s weights from now on, as `version`."""
        t0 = time.perf_counter()
        self._send(model, version)
        return {"time/sync": time.perf_counter() - t0}

    @abstractmethod
    def _send(self, model: nn.Module, version: int) -> None:
        """Bring `model`'s weights to the engine (the kind's own way)."""

    def first_sync(self, model: nn.Module) -> None:
        """Before step 1 of a fresh run: send `model`'s weights as version 0 unless the engine
        was built from them (servers given by URL may hold other weights)."""
        if not self.built_from_model:
            self.sync(model, 0)

    def final_model(self, model: nn.Module) -> nn.Module:
        """The model rank 0 exports at the end: the trained one (the export merges LoRA)."""
        return model

    @property
    def in_flight_updates(self) -> bool:
        """Whether `sync` may run while episodes generate, without draining first (module doc)."""
        return self.engine.in_flight_updates

    def release_idle_memory(self) -> None:
        """Nothing generates until the next batch: free what the sampler holds only for
        generating (module doc). Nothing to free here: servers hold theirs in their own processes."""
        return None


class InProcessPlacement(Placement):
    """A torch engine in this process (`shared` or `copy`), whose caches can be freed between batches."""

    def __init__(self, engine: TorchEngine, *, shares_weights: bool) -> None:
        super().__init__(engine, shares_weights=shares_weights)
        self.torch_engine = engine

    def release_idle_memory(self) -> None:
        """Free the engine's KV-cache slots and prefix cache (kept if a sequence is still active);
        what it samples next is unchanged (tests/test_sampler_memory.py)."""
        self.torch_engine.release_memory()


class SharedPlacement(InProcessPlacement):
    """The torch engine samples from the trainer's own tensors: an optimizer step is already its."""

    kind = "shared"

    @property
    def in_flight_updates(self) -> bool:
        """Never: the optimizer step rewrites the tensors the engine samples from (drain first)."""
        return False

    def _send(self, model: nn.Module, version: int) -> None:
        self.engine.sync_weights(None, version=version)  # only the version moves


class CopyPlacement(InProcessPlacement):
    """The torch engine samples from its own frozen copy, overwritten with the merged weights
    after each step. Under FSDP every rank gathers them into its full copy (each samples its
    share of the groups), and rank 0 exports that copy."""

    kind = "copy"

    def __init__(
        self, engine: TorchEngine, copy: nn.Module, *, shares_weights: bool, sharded: bool
    ) -> None:
        super().__init__(engine, shares_weights=shares_weights)
        self.copy = copy
        self.sharded = sharded

    def _send(self, model: nn.Module, version: int) -> None:
        self.engine.sync_weights(merged_weights(model), version=version)

    def final_model(self, model: nn.Module) -> nn.Module:
        """The copy under FSDP (full, synced after the last step), else the trained model."""
        return self.copy if self.sharded else model


class ServerPlacement(Placement):
    """vLLM servers that rank 0 alone drives; after each step the merged full weights are
    written to RAM and reloaded by every server (under FSDP every rank takes part in the
    gather). `copy`, under FSDP only, is rank 0's full model to export: it lags the servers and
    is refreshed at the end."""

    kind = "servers"
    main_only = True
    built_from_model = False  # servers given by URL may hold other weights

    def __init__(self, engine: TrainableEngine, copy: nn.Module | None) -> None:
        super().__init__(engine)
        self.copy = copy

    def _send(self, model: nn.Module, version: int) -> None:
        self.engine.sync_weights(merged_weights(model), version=version)

    def final_model(self, model: nn.Module) -> nn.Module:
        """Under FSDP the copy, loaded with the gathered weights (every rank gathers)."""
        if self.copy is None:
            return model
        self.copy.load_state_dict(merged_weights(model))
        return self.copy


class AdapterPlacement(ServerPlacement):
    """vLLM servers started with `--enable-lora` on the base weights; after each step the PEFT
    adapter alone is saved and hot-loaded as `policy-vN`. Under FSDP every rank gathers the
    adapter's tensors (not the base weights) and rank 0 saves them; `copy` is then rank 0's full
    model to export, refreshed with the merged weights at the end."""

    kind = "adapters"

    def __init__(self, engine: AdapterEngine, copy: nn.Module | None = None) -> None:
        super().__init__(engine, copy)
        self.adapters = engine

    def _send(self, model: nn.Module, version: int) -> None:
        adapter = adapter_weights(model)  # every rank under FSDP (FollowerPlacement too)
        with tempfile.TemporaryDirectory(prefix="looprl-adapter-") as tmp:
            model.save_pretrained(tmp, state_dict=adapter)  # type: ignore[operator]
            self.adapters.load_adapter(Path(tmp), version=version)


class FollowerEngine:
    """The engine of ranks other than 0 when rank 0 drives remote servers: it samples nothing
    (rank 0 hands every rank the batch) and only follows the policy version."""

    token_level = True
    in_flight_updates = False  # it samples nothing; rank 0's placement decides

    def __init__(self) -> None:
        self.policy_version = 0

    async def generate(self, request: GenerationRequest) -> Generation:
        """Never called: only rank 0 samples."""
        raise RuntimeError("only rank 0 samples when it drives remote servers")

    def sync_weights(self, weights: Any, *, version: int | None = None) -> None:
        """Nothing to load (rank 0 sends the weights); the version moves."""
        self.policy_version = self.policy_version + 1 if version is None else version

    async def close(self) -> None:
        """Nothing to release."""
        return None


class FollowerPlacement(Placement):
    """Ranks other than 0 under FSDP with vLLM: no engine of their own, no copy; each sync and
    the final export take part in the gather that rank 0 sends or saves (`adapters`: each
    sync gathers the LoRA tensors alone, as rank 0's `AdapterPlacement` does)."""

    kind = "follower"
    main_only = True
    built_from_model = False  # takes part in rank 0's first sync

    def __init__(self, *, adapters: bool = False) -> None:
        super().__init__(FollowerEngine())
        self.gather = adapter_weights if adapters else merged_weights

    def _send(self, model: nn.Module, version: int) -> None:
        self.gather(model)  # rank 0's gather is a collective: every rank takes part
        self.engine.sync_weights(None, version=version)

    def final_model(self, model: nn.Module) -> nn.Module:
        """Take part in rank 0's gather for its export; the sharded model stays unexported here."""
        merged_weights(model)
        return model


def make_placement(
    model: nn.Module,
    tokenizer: Any,
    engine: EngineSection,
    *,
    group: ProcessGroup | None = None,
    generate_ahead: bool = False,
    seed: int = 0,
    max_model_len: int = 2048,
) -> Placement:
    """The placement of `model` (plain, or PEFT LoRA: the adapters are the LoRA settings).

    `group` is this process's group under torchrun (None: one process, unsharded);
    `generate_ahead` is `max_async_steps > 0` (the engine then needs weights of its own);
    `max_model_len` bounds a vLLM server's context. Build it before the model is sharded.
    """
    lora = lora_config(model)
    if engine.kind == "vllm":
        if group is not None and not group.is_main:
            return FollowerPlacement(adapters=lora is not None)
        served = vllm_engine(
            tokenizer, engine, model=model, max_model_len=max_model_len, seed=seed,
            lora_rank=None if lora is None else lora.r,
        )  # fmt: skip
        copy = frozen_copy(model) if group is not None else None  # rank 0's export under FSDP
        if lora is not None:
            return AdapterPlacement(served, copy)
        return ServerPlacement(served, copy)
    if group is None or group.is_main:
        sweep_and_report()  # RAM that killed vLLM-backed runs left (vllm_engine sweeps too)
    own = lora is not None or generate_ahead or group is not None
    sampled = frozen_copy(model) if own else model
    torch_engine = TorchEngine(
        sampled, tokenizer, max_batch_size=engine.max_concurrency, seed=seed,
        kv_cache_mb=engine.kv_cache_mb,
    )  # fmt: skip
    if not own:
        return SharedPlacement(torch_engine, shares_weights=True)
    same = lora is None and not generate_ahead  # under FSDP the gathered copy holds the values
    return CopyPlacement(torch_engine, sampled, shares_weights=same, sharded=group is not None)
