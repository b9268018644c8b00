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
