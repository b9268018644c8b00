"""How training samples are dealt to ranks: contiguous blocks, so a group stays on one rank."""

from __future__ import annotations

import pytest

from looprl.trainer.distributed import Dist, block_share


def _dist(rank: int, world: int) -> Dist:
    return Dist(rank=rank, world=world, mesh=None, slow_group=None)


@pytest.mark.parametrize("n, world", [(8, 2), (7, 2), (10, 3), (2, 4), (0, 2)])
def test_blocks_cover_every_item_once_in_order_with_sizes_within_one(n, world):
    items = list(range(n))
    shares = [block_share(items, _dist(r, world)) for r in range(world)]
    assert [x for share in shares for x in share] == items
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1


def test_two_groups_of_four_land_on_one_rank_each():
    samples = [f"g{g}s{s}" for g in range(2) for s in range(4)]  # group-major, as samples come
    assert block_share(samples, _dist(0, 2)) == ["g0s0", "g0s1", "g0s2", "g0s3"]
    assert block_share(samples, _dist(1, 2)) == ["g1s0", "g1s1", "g1s2", "g1s3"]
    assert block_share(samples, None) == samples


def _ranks_gather_beside_an_update(rank: int, port: int, main_only: bool) -> None:
    """One rank: 4 batches exchanged by `run_shared` in step order while a thread all-reduces on
    the default group, as the update's FSDP collectives do (`max_async_steps > 0`)."""
    import asyncio
    import os
    import random
    import time

    import torch
    import torch.distributed as dist

    from looprl.trainer.distributed import close_distributed, init_distributed, run_shared

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank))  # fmt: skip
    d, _ = init_distributed(torch.device("cpu"), 10.0, 10.0)
    assert d is not None
    rng = random.Random(rank)

    def update() -> None:
        for i in range(200):
            t = torch.full((256,), float(i + rank))
            dist.all_reduce(t)
            assert float(t[0]) == 2 * i + 1  # (i + 0) + (i + 1): paired with the same call
            time.sleep(rng.random() * 0.001)

    async def generate(share: list[int]) -> list[tuple[int, int]]:
        await asyncio.sleep(rng.random() * 0.02)  # the ranks finish their shares at other times
        return [(i, rank) for i in share]

    async def main() -> list[list[tuple[int, int]]]:
        updating = asyncio.create_task(asyncio.to_thread(update))
        batches = [
            await run_shared(d, list(range(10 * s, 10 * s + 5)), generate, main_only=main_only)
            for s in range(4)
        ]
        await updating
        return batches

    batches = asyncio.run(main())
    for s, batch in enumerate(batches):
        owner = [0] * 5 if main_only else [0, 1, 0, 1, 0]  # i % world, or rank 0 alone
        assert batch == [(10 * s + j, owner[j]) for j in range(5)], batch
    close_distributed(d)


@pytest.mark.parametrize("main_only", [False, True])
def test_batches_gathered_beside_an_update_pair_up_across_ranks(main_only):
    """Generation's exchanges and the update's collectives run at once without crossing."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(  # forked: the children start with torch imported (seconds saved)
        _ranks_gather_beside_an_update, args=(port, main_only), nprocs=2, start_method="fork"
    )


def test_the_pick_rule_takes_the_smallest_round_then_position_over_all_ranks():
    from looprl.trainer.stream_shared import pick

    ready = [[(1, 0), (0, 4)], [(0, 5), (1, 1), (2, 3)]]  # (round first reported, position)
    assert pick(ready, 3) == [(0, 4), (0, 5), (1, 0)]
    assert pick(ready[::-1], 3) == [(0, 4), (0, 5), (1, 0)]  # the same whatever rank holds what
    assert pick(ready, 6) is None  # five ready: the ranks exchange again


def _ranks_stream_and_pick(rank: int, port: int) -> None:
    """One rank: its own stream (positions p % 2 == rank, random lengths, position 1 slow) and
    three steps of 3 groups taken through the exchange; both ranks must train the same groups."""
    import asyncio
    import os
    import random

    import torch

    from looprl.engines.scripted import ScriptedEngine
    from looprl.trainer.distributed import close_distributed, gather_objects, init_distributed
    from looprl.trainer.stream_shared import SharedStreamSource
    from looprl.trainer.streaming import GroupStream, RequestGate, StreamSource
    from looprl.types import EpisodeResult, Message, Task

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank))  # fmt: skip
    d, _ = init_distributed(torch.device("cpu"), 10.0, 10.0)
    assert d is not None
    rng, version = random.Random(rank), [0]

    async def run(position: int) -> list[EpisodeResult]:
        await asyncio.sleep(0.5 if position == 1 else rng.random() * 0.03)
        task = Task(id=f"t{position}", prompt=[Message(role="user", content="hi")])
        return [EpisodeResult(task=task, reward=float(i), rollout_index=i) for i in range(2)]

    async def main() -> tuple[list[list[int]], dict]:
        stream = GroupStream(run, lambda: version[0], per_step=2, ahead=1, cursor=rank, stride=2)
        gate = RequestGate(ScriptedEngine(["x"]))
        base = StreamSource(stream, gate, max_staleness=1, in_flight=True, ledger=None)
        source = SharedStreamSource(base, d, total=3)
        steps = []
        for step in (1, 2, 3):
            batch = await source.take(step)
            steps.append([int(g[0].task.id[1:]) for g in batch.groups])
            version[0] = step  # the update and the sync
        state = source.state()
        await source.close()
        return steps, state

    steps, state = asyncio.run(main())
    assert gather_objects(d, steps) == [steps, steps]  # the same groups, in the same order
    assert all(len(s) == 3 for s in steps) and len({p for s in steps for p in s}) == 9
    assert 1 not in steps[0]  # the slow group held no step back
    assert {p % 2 for s in steps for p in s} == {0, 1}  # both ranks' groups are trained
    ranks = state["stream"]["ranks"]
    assert [r["cursor"] % 2 for r in ranks] == [0, 1]  # each rank's own positions
    assert sum(r["trained"] for r in ranks) == 9
    close_distributed(d)


def test_streaming_ranks_pick_the_same_groups_in_the_same_order():
    """Each rank streams its own tasks; at each step they exchange what is ready and all train
    the same groups (`looprl.trainer.stream_shared`)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_ranks_stream_and_pick, args=(port,), nprocs=2, start_method="fork")
