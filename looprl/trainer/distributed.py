"""Multi-process training under `torchrun`: torch's own FSDP2 and collectives, nothing home-made.

What changes with N processes (one process changes nothing: every helper here is a no-op or
the identity when `dist` is None):

1. `init_distributed` joins the group `torchrun` describes in its environment variables (gloo on
   CPU, NCCL on GPU) with `trainer.collective_timeout_s` on every collective, so a rank that
   dies or hangs ends the job with an error instead of a silent wait.
2. `shard` applies `fully_shard` to each decoder block, then to the root (the policy, the
   reference model, the PPO value head). Gradients are summed over ranks, not averaged
   (`set_gradient_divide_factor(1)`): each rank's loss is already divided by the global
   normaliser, so the sum is the single-process gradient.
3. Rollouts: rank r runs the groups i with i % N == r on its own engine (a full copy of the
   weights), then `gather_in_order` hands every rank the whole batch in the single-process
   order. Advantages, normalisers and the logged rollout metrics are therefore computed on the
   same global batch by every rank; each rank then trains on its share of the samples.
   Generation's collectives never share a process group with the update's: with
   `max_async_steps > 0` later batches generate (and gather) while the update's FSDP
   collectives run in a thread, and two threads issuing collectives on one group would pair
   the wrong calls across ranks. So batches are gathered on `Dist.rollout_group` (rank 0's
   vLLM batch is broadcast on `slow_group`), in a worker thread so the event loop keeps
   generating; batches start in step order (`looprl.trainer.async_batches`), so every rank
   issues those collectives in the same order. Streaming (`looprl.trainer.stream_shared`)
   exchanges its ready groups on the same group, at each step's take.
4. After each step every rank gathers the full weights (`DTensor.full_tensor`, LoRA merged:
   `looprl.models.weights.merged_weights`) for its engine copy, or for the vLLM servers rank 0
   drives (`looprl.engines.placement`).
5. Logging, evaluation, exports and plots happen on rank 0; the others wait at
   `wait_for_main`, on a group of its own with `trainer.main_phase_timeout_s` (an evaluation
   may take longer than one collective should).

Checkpoints under torchrun are sharded (`looprl.trainer.checkpoint.sharded`); bf16 compute is
FSDP's mixed-precision policy (`looprl.trainer.precision`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from looprl.trainer.precision import AutocastModel, shard_policy, upcast_output

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Dist:
    """This process's place in the group: `rank` of `world`, the FSDP mesh, a slow group, and
    the group that gathers generated batches (module doc, point 3)."""

    rank: int
    world: int
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh
    slow_group: Any  # ProcessGroup with main_phase_timeout_s, for waits on rank 0's own work
    rollout_group: Any = None  # gloo ProcessGroup with collective_timeout_s, generation's alone

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun_world_size() -> int:
    """WORLD_SIZE as `torchrun` sets it (1 when not launched by torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(
    device: torch.device, collective_timeout_s: float, main_phase_timeout_s: float
) -> tuple[Dist | None, torch.device]:
    """Join torchrun's process group when WORLD_SIZE > 1; returns (dist or None, this rank's device)."""
    if torchrun_world_size() <= 1:
        return None, device
    from torch.distributed.device_mesh import init_device_mesh

    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=collective_timeout_s))
    slow = dist.new_group(backend="gloo", timeout=timedelta(seconds=main_phase_timeout_s))
    rollout = dist.new_group(backend="gloo", timeout=timedelta(seconds=collective_timeout_s))
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    return Dist(dist.get_rank(), dist.get_world_size(), mesh, slow, rollout), device


def close_distributed(d: Dist | None) -> None:
    """Leave the process group (after a run that ended normally)."""
    if d is not None and dist.is_initialized():
        dist.destroy_process_group()


def shard(
    module: torch.nn.Module, d: Dist, *, blocks: bool = True, dtype: torch.dtype | None = None
) -> None:
    """`fully_shard` each decoder block (`blocks`), then the root; gradients summed over ranks.

    `dtype` (bf16) computes in it over float32 master weights, reducing in float32.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    policy = shard_policy(dtype)
    if blocks:
        for layer in decoder_layers(module):
            fully_shard(layer, mesh=d.mesh, mp_policy=policy)
    fully_shard(module, mesh=d.mesh, mp_policy=policy)
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # a sum: each loss is already globally normalised
            m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)


def shard_all(
    d: Dist | None,
    policy: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    value_head: torch.nn.Module | None,
    dtype: torch.dtype | None = None,
) -> None:
    """The policy and reference model per decoder block, the value head whole (None: unsharded)."""
    if d is None:
        return
    shard(policy, d, dtype=dtype)
    if ref_model is not None:
        shard(ref_model, d, dtype=dtype)
    if value_head is not None:
        shard(value_head, d, blocks=False, dtype=dtype)


class _RootForward(torch.nn.Module):
    """A sharded model seen through its root's own forward.

    `forward_logprobs` scores Llama-like models by calling the decoder and the head separately
    (projecting only the trained positions); that would bypass the FSDP root's hooks, which
    gather the embeddings, final norm and head and reduce their gradients. This wrapper has no
    `config`, so it takes the model's whole forward: correct under FSDP, at the price of the
    full (B, T, V) logits. Logits and hidden states come back as float32 (bf16 compute too).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **kwargs: Any) -> Any:
        return upcast_output(self.model(**kwargs))


def for_scoring(
    model: torch.nn.Module, d: Dist | None, dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """What the update scores with: the model, its FSDP root forward, or it under autocast.

    Under FSDP the root forward (FSDP's policy casts to `dtype`, see `shard`); with one process
    and `dtype` bf16 the model under `torch.autocast`; otherwise the model itself.
    """
    if d is not None:
        return _RootForward(model)
    return model if dtype is None else AutocastModel(model, dtype)


def decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    """The decoder blocks of a Hugging Face causal LM (`model.model.layers` for Llama-like ones)."""
    get_decoder = getattr(model, "get_decoder", None)
    layers = getattr(get_decoder(), "layers", None) if callable(get_decoder) else None
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ValueError(
            f"cannot find the decoder blocks of {type(model).__name__} to shard; FSDP training "
            "needs a Hugging Face causal LM whose get_decoder() has .layers"
        )
    return list(layers)


def my_share(items: Sequence[T], d: Dist | None) -> list[T]:
    """The items i with i % world == rank (all of them without `dist`)."""
    return list(items) if d is None else list(items[d.rank :: d.world])


def block_share(items: Sequence[T], d: Dist | None) -> list[T]:
    """This rank's contiguous block of `items`: ranks get runs of neighbours, sizes within one.

    Training samples come group by group, so a block keeps a group's samples (which share their
    prompt) on one rank, where the update forwards that prompt once.
    """
    if d is None:
        return list(items)
    n = len(items)
    return list(items[d.rank * n // d.world : (d.rank + 1) * n // d.world])


async def run_shared(
    d: Dist | None,
    items: Sequence[T],
    run: Callable[[list[T]], Awaitable[list[R]]],
    *,
    main_only: bool = False,
) -> list[R]:
    """`run` on this rank's share of `items`, then every rank gets all results in item order.

    `main_only`: rank 0 runs them all (it drives remote servers) and hands every rank the
    results, the others waiting within `main_phase_timeout_s`. The exchange runs in a worker
    thread on a group the update never uses (module doc, point 3), so it may overlap an update.
    """
    if d is not None and main_only:
        mine = await run(list(items)) if d.is_main else None
        return await asyncio.to_thread(from_main, d, mine, slow=True) or []  # rank 0 sends a list
    local = await run(my_share(items, d))
    if d is None:
        return local
    return await asyncio.to_thread(gather_in_order, d, local, d.rollout_group)


def gather_in_order(d: Dist, local: list[R], group: Any = None) -> list[R]:
    """Undo `my_share`: rank r's j-th result is item j * world + r (on `group`; None: the default)."""
    parts: list[Any] = [None] * d.world
    dist.all_gather_object(parts, local, group=group)
    total = sum(len(p) for p in parts)
    return [parts[i % d.world][i // d.world] for i in range(total)]


def max_over_ranks(d: Dist | None, value: int) -> int:
    """The largest `value` any rank holds (e.g. micro-batch counts, which must agree under FSDP)."""
    if d is None:
        return value
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gather_objects(d: Dist | None, obj: T, group: Any = None) -> list[T]:
    """Every rank's `obj` (just `[obj]` without `dist`), on `group` (None: the default)."""
    if d is None:
        return [obj]
    parts: list[Any] = [None] * d.world
    dist.all_gather_object(parts, obj, group=group)
    return parts


def from_main(d: Dist | None, value: T, *, slow: bool = False) -> T:
    """Rank 0's `value` on every rank (a decision only rank 0 can make, e.g. early stop).

    `slow`: on the group with `main_phase_timeout_s` (rank 0 may work long before it sends).
    """
    if d is None:
        return value
    box: list[Any] = [value]
    dist.broadcast_object_list(box, src=0, group=d.slow_group if slow else None)
    return box[0]


def wait_for_main(d: Dist | None) -> None:
    """All ranks meet after rank 0's own work (evaluation, export), within main_phase_timeout_s."""
    if d is not None:
        dist.barrier(group=d.slow_group)


_COLLECTIVE_WORDS = ("timed out", "timeout", "connection", "peer", "gloo", "nccl")


def explain_failure(d: Dist | None, exc: BaseException, timeout_s: float) -> str | None:
    """What to tell the user when a collective failed on this rank (None: not a collective's error)."""
    if d is None or not isinstance(exc, dist.DistError | RuntimeError):
        return None
    text = str(exc).lower()
    if not isinstance(exc, dist.DistError) and not any(w in text for w in _COLLECTIVE_WORDS):
        return None  # an ordinary error (a bug, a bad shape): its own traceback says enough
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return (
        f"rank {d.rank}: a collective failed or timed out ({type(exc).__name__}: {first}). "
        f"Another rank died or hangs: a collective waits at most trainer.collective_timeout_s "
        f"= {timeout_s:g} s. torchrun's report below names the rank that failed first."
    )


def unsupported(cfg: Any) -> list[str]:
    """Settings multi-process training refuses (`cfg` a TrainConfig), each with the field to change.

    Every placement (LoRA with vLLM included), bounded-staleness async
    (`trainer.max_async_steps > 0`) and streaming with in-process engines
    (`looprl.trainer.stream_shared`) run under torchrun; streaming on vLLM servers does not.
    """
    if cfg.trainer.streaming and cfg.engine.kind == "vllm":
        return ["trainer.streaming = true with engine.kind = 'vllm' (use one process, or "
                "trainer.streaming = false)"]  # fmt: skip
    return []


class SilentLogger:
    """The metrics logger of ranks other than 0: they log nothing (rank 0 logs the whole batch)."""

    def log(self, step: int, metrics: Any) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        return None
